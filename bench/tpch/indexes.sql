-- Keys and indexes made after the load (the usual TPC-H / DBT-3 set): every table's primary
-- key, and an index on each foreign key the 22 queries join or filter on.
-- lineitem's primary key (l_orderkey, l_linenumber) leads with l_orderkey, so it is also the
-- index on lineitem(l_orderkey) (joins with orders; Q4, Q18, Q21's EXISTS); a separate one
-- would only double the work.
-- One statement per line: `farcache bench paper` runs and times them one by one.

ALTER TABLE region ADD PRIMARY KEY (r_regionkey);
ALTER TABLE nation ADD PRIMARY KEY (n_nationkey);
ALTER TABLE part ADD PRIMARY KEY (p_partkey);
ALTER TABLE supplier ADD PRIMARY KEY (s_suppkey);
ALTER TABLE partsupp ADD PRIMARY KEY (ps_partkey, ps_suppkey);
ALTER TABLE customer ADD PRIMARY KEY (c_custkey);
ALTER TABLE orders ADD PRIMARY KEY (o_orderkey);
ALTER TABLE lineitem ADD PRIMARY KEY (l_orderkey, l_linenumber);
CREATE INDEX i_n_regionkey ON nation (n_regionkey);
CREATE INDEX i_s_nationkey ON supplier (s_nationkey);
CREATE INDEX i_c_nationkey ON customer (c_nationkey);
CREATE INDEX i_ps_suppkey ON partsupp (ps_suppkey);
CREATE INDEX i_o_custkey ON orders (o_custkey);
CREATE INDEX i_o_orderdate ON orders (o_orderdate);
CREATE INDEX i_l_partkey_suppkey ON lineitem (l_partkey, l_suppkey);
CREATE INDEX i_l_suppkey ON lineitem (l_suppkey);
CREATE INDEX i_l_shipdate ON lineitem (l_shipdate);
