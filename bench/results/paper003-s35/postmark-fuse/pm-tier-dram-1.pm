set location /var/tmp/fc-pm/m-tier-dram/work
set size 5000 20000
set number 30000
set transactions 30000
set seed 42
run
quit
