#!/usr/bin/env python3
"""Issue 17's "Nothing gets slower" table from the results of scripts/bench-nothing-slower.sh.

Reads DIR/<profile>-<experiment>/paper-<profile>.json (default DIR: bench/results/nothing-slower),
and DIR/<profile>-<experiment>/rep<K>/paper-<profile>.json where the job was repeated (REPEAT in
scripts/bench-nothing-slower.sh: each repetition one pair, the passthrough first in odd ones and
farcache first in even ones, the pairs spread over the run), and prints one markdown table:
every workload the runs hold (rows) by disk profile and link (columns), as farcache ÷
passthrough performance ratios from the same `bench paper` invocation
(> 1: farcache faster), each marked against its target. A job that ran farcache alone (tpch at
10 Gbit/s: the passthrough sends nothing over the link) is compared with the passthrough of the
same profile's 1 Gbit/s job (its pair of the same number where both were repeated), and its
cells say so. A repeated job's cell is the median of its pairs' ratios, with their range and
count; disturbed pairs (more than STEAL_FLAG of the machine's CPU time stolen during one of
the measurements, or the harness's CPU checks more than CPU_SPREAD apart) are set aside from
the median when at least one pair was not, and the median of all of them is shown beside it.
Exits 1 when no result is found.

    scripts/nothing-slower-table.py [DIR]
    scripts/nothing-slower-table.py --disturbed FILE.json...   # exit 0: disturbed
    scripts/nothing-slower-table.py --pooled DIR...            # each cell's pairs over several runs
"""
import glob
import json
import math
import os
import re
import sys

PROFILES = ["raw", "cloud", "hdd", "cloud 10gbit"]


def human(n):
    return f"{n >> 30}GiB" if n >= 1 << 30 else f"{n >> 20}MiB"


OTHER_IO_FLAG = 64 << 20  # as the harness's OTHER_IO_FLAG_BYTES
OTHER_IO_RATE = 16 << 20  # and OTHER_IO_FLAG_RATE (bytes per second)


def other_io(*measurements):
    """A mark for a ratio whose measurements saw other traffic on the machine's disk under the
    loop device (recorded by harnesses that count it: `host_bytes`), as the harness flags it.
    Each measurement: (disk record, seconds)."""
    worst = 0
    for d, secs in measurements:
        if d:
            o = d.get("host_bytes", 0) - d.get("read_bytes", 0) - d.get("write_bytes", 0)
            if o > OTHER_IO_FLAG and o > OTHER_IO_RATE * secs:
                worst = max(worst, o)
    return f" †{worst >> 20} MiB" if worst else ""


OTHER_CPU_GAP = 0.3  # CPUs


def other_cpu(fc, pt):
    """A mark for a ratio whose two measurements had the rest of the machine using CPU
    differently (more than OTHER_CPU_GAP CPUs apart, on average): on two vCPUs a build
    beside one of them, even at idle priority, slows it (shared core, caches)."""
    if fc is None or pt is None:
        return ""
    gap = fc - pt
    return f" ‡{gap:+.1f} CPU" if abs(gap) > OTHER_CPU_GAP else ""


DISK_SPREAD = 1.3  # as the harness's DISK_CHECK_SPREAD: slowest ÷ fastest disk check of a ratio's measurements


def disk_speed(*disks):
    """A mark for a ratio whose measurements found the disk itself at different speeds: the
    harness times 4 KiB O_DIRECT reads of the disk (outside the profile's throttle) at the
    start and the end of each measurement (`check_before_us`, `check_after_us`); on a shared
    machine the disk under the loop device moves with what other machines do to it, which no
    count here sees. Marked when the slowest check is more than DISK_SPREAD times the
    fastest; with the steal mark of the same measurements (`steal`)."""
    xs = [v for d in disks if d for v in (d.get("check_before_us"), d.get("check_after_us")) if v]
    if len(xs) < 2:
        return ""
    spread = max(xs) / min(xs)
    mark = f" §{spread:.1f}×" if spread > DISK_SPREAD else ""
    return mark + cpu_speed(*disks) + steal(*disks)


CPU_SPREAD = 1.2  # as the harness's CPU_CHECK_SPREAD: slowest ÷ fastest CPU check


def cpu_spread(*disks):
    """Slowest ÷ fastest of the harness's CPU checks (`cpu_check_before_us`,
    `cpu_check_after_us`: a fixed loop timed at the start and end of each measurement) in
    these measurements; 1.0 where fewer than two were recorded (documents before session 49)."""
    xs = [v for d in disks if d for v in (d.get("cpu_check_before_us"), d.get("cpu_check_after_us")) if v]
    return max(xs) / min(xs) if len(xs) > 1 else 1.0


def cpu_speed(*disks):
    """A mark for a ratio whose measurements found the machine's CPU at different speeds (a
    shared virtual machine's vCPUs run slower while other guests load the host's cores,
    which steal does not count)."""
    spread = cpu_spread(*disks)
    return f" ◊{spread:.1f}×" if spread > CPU_SPREAD else ""


def upset(*disks):
    """Whether these measurements are not comparable: more than STEAL_FLAG of the machine's CPU
    time stolen in one of them, or CPU checks more than CPU_SPREAD apart."""
    return stolen(*disks) > STEAL_FLAG or cpu_spread(*disks) > CPU_SPREAD


STEAL_FLAG = 0.05  # as the harness's STEAL_FLAG: share of the machine's CPU time stolen


def stolen(*disks):
    """The largest share of the machine's CPU time the hypervisor stole during one of these
    measurements (`steal_ticks` over `cpu_ticks`, from /proc/stat); 0.0 where none was
    recorded."""
    xs = [d["steal_ticks"] / d["cpu_ticks"] for d in disks if d and d.get("cpu_ticks")]
    return max(xs, default=0.0)


def steal(*disks):
    """A mark for a ratio one of whose measurements lost more than STEAL_FLAG of the machine's
    CPU time to the hypervisor: a shared virtual machine's vCPUs are taken away while other
    guests run, and every wake-up on the mount's hit path waits for one."""
    worst = stolen(*disks)
    return f" ¶{worst * 100:.0f}%" if worst > STEAL_FLAG else ""


def pg_other_cpus(r):
    c = r.get("cpu") or {}
    secs = r.get("secs") or 0
    if not secs or "machine_ms" not in c:
        return None
    return max(0.0, c["machine_ms"] - c.get("client_ms", 0) - c.get("lenders_ms", 0)) / 1e3 / secs


def paired(measurements, key, usable):
    """The pairs of measurements behind a document's ratios, for the table (`ratios`) and for
    judging whether a pair was disturbed (`disturbed`) alike: (key, farcache, passthrough) for
    every key that both configurations measured without error and `usable`, in the order of
    the keys."""
    got = {}
    for r in measurements or []:
        if not r.get("error") and usable(r):
            got[(key(r), r.get("config"))] = r
    return [(k, fc, got[(k, "passthrough")]) for (k, cfg), fc in sorted(got.items(), key=lambda x: x[0])
            if cfg == "farcache" and (k, "passthrough") in got]


def paired_runs(doc):
    """`paired` for the runs (seqread, randread): by experiment and size, those with passes."""
    return paired(doc.get("runs"), lambda r: (r.get("experiment"), r.get("size_bytes")), lambda r: r.get("passes"))


def paired_pgbench(doc):
    """`paired` for the pgbench runs: by mode and clients, those with a rate."""
    return paired(doc.get("pgbench"), lambda r: (r.get("mode"), r.get("clients")), lambda r: r.get("tps"))


# The tpch tests measured as a whole (`bench paper`'s `load`, `power_phase`, `throughput_phase`:
# each with the harness's disk, CPU and steal checks), behind the table's three tpch ratios.
TPCH_PHASES = ("load", "power_phase", "throughput_phase")


def ratios(doc, borrowed=None):
    """(workload, ratio, target) rows of one result document. `borrowed`: a document of the
    same profile whose passthrough stands in where this one ran farcache alone (tpch only)."""
    fast_link = doc.get("options", {}).get("link_rate") not in (None, "1gbit")
    out = []
    for (exp, size), fc, pt in paired_runs(doc):
        for p_fc, p_pt in zip(fc["passes"], pt["passes"]):
            n = p_fc["pass"]
            # Item 7: at 10 Gbit/s a stream that fits in the lenders is served from them on
            # its second pass, at least 3x the passthrough.
            # (A file the client's page cache holds is served from there on pass 2 in both.)
            fits_client = size <= doc.get("options", {}).get("memory_bytes", 0)
            target = 3.0 if fast_link and exp == "seqread" and n == 2 and not fits_client else 0.97
            out.append((f"{exp} {human(size)} pass {n}", p_pt["secs"] / p_fc["secs"], target,
                        other_io((p_fc.get("disk"), p_fc["secs"]), (p_pt.get("disk"), p_pt["secs"]))
                        + other_cpu(fc.get("other_cpus"), pt.get("other_cpus"))
                        + disk_speed(p_fc.get("disk"), p_pt.get("disk")),
                        upset(p_fc.get("disk"), p_pt.get("disk"))))
        if exp == "randread" and len(fc["passes"]) > 1:
            p = fc["passes"][1]
            hit = p.get("hit_ratio_page_cache", 0) + p.get("hit_ratio_remote", 0)
            # The target applies where the routing used the lenders (its probe reads went to
            # them); a rule that kept the reads on a disk as fast as a lender hit is right to.
            probe = fc.get("probe") or {}
            on_lenders = probe.get("lender_hits", 0) * 2 >= probe.get("measured", {}).get("reads", 0)
            st = upset(p.get("disk"))
            out.append((f"randread {human(size)} pass 2 hit ratio (page cache + lenders)", hit, None if on_lenders else "n/a", "", st))
            # The issue's own measure: of the blocks the mount asked the lenders for, the
            # share they held (what the routing sent to the disk is not asked).
            m = p.get("mount") or {}
            asked = m.get("hits", 0) + m.get("misses", 0)
            if asked:
                out.append((f"randread {human(size)} pass 2 hit ratio (blocks asked of lenders)", m["hits"] / asked, None, "", st))
    for (mode, clients), r, pt in paired_pgbench(doc):
        target = 1.0 if mode == "tpc-b" and clients >= 4 else 0.97
        out.append((f"pgbench {mode} {clients} clients", r["tps"] / pt["tps"], target, other_io((r.get("disk"), r.get("secs", 0)), (pt.get("disk"), pt.get("secs", 0)))
                    + other_cpu(pg_other_cpus(r), pg_other_cpus(pt))
                    + disk_speed(r.get("disk"), pt.get("disk")),
                    upset(r.get("disk"), pt.get("disk"))))
    tp = {r["config"]: r for r in doc.get("tpch") or [] if not r.get("error")}
    note = ""
    if "passthrough" not in tp and borrowed is not None:
        pts = [r for r in borrowed.get("tpch") or [] if r["config"] == "passthrough" and not r.get("error")]
        if pts:
            tp["passthrough"] = pts[0]
            note = " (passthrough of the 1 Gbit/s job)"
    if "farcache" in tp and "passthrough" in tp:
        fc, pt = tp["farcache"], tp["passthrough"]
        # Item 7: at 10 Gbit/s the lenders beat the disk for TPC-H's scans too: >= 5x.
        big = 5.0 if fast_link else 0.97
        for name, key, faster, phase in zip(("load test", "power test", "throughput test"),
                                            ("load_secs", "power_secs", "queries_per_hour"),
                                            ("lower", "lower", "higher"), TPCH_PHASES):
            a, b = fc.get(key), pt.get(key)
            if a and b:
                ratio = b / a if faster == "lower" else a / b
                # Each test's own measurement marks its ratio (the load test's too: a host
                # that slowed the CPU under one COPY slows it as much as a query).
                ph = [(r.get(phase) or {}) for r in (fc, pt)]
                mark = other_io(*((p.get("disk"), p.get("secs", 0)) for p in ph))
                mark += disk_speed(*(p.get("disk") for p in ph))
                st = upset(*(p.get("disk") for p in ph))
                out.append((f"tpch {name}", ratio, 0.97 if name == "load test" else big, mark + note, st))
    return out


def disturbed(doc):
    """(steal, CPU spread) of the document: the largest share of the machine's CPU time stolen in
    any of its measurements (each pass, each pgbench run, each tpch load, power and throughput test,
    of either configuration), and the largest spread of CPU checks within one of them or
    between the two behind one of its ratios. scripts/bench-nothing-slower.sh measures a pair
    again when either is past its flag (RETRY)."""
    disks = [p.get("disk") for r in doc.get("runs") or [] for p in r.get("passes") or []]
    disks += [r.get("disk") for r in doc.get("pgbench") or []]
    disks += [(r.get(ph) or {}).get("disk") for r in doc.get("tpch") or [] for ph in TPCH_PHASES]
    spread = max([cpu_spread(d) for d in disks] + [1.0])
    # Between configurations: the pairs of measurements behind the table's ratios.
    for _, fc, pt in paired_runs(doc):
        for p, q in zip(fc["passes"], pt["passes"]):
            spread = max(spread, cpu_spread(p.get("disk"), q.get("disk")))
    for _, fc, pt in paired_pgbench(doc):
        spread = max(spread, cpu_spread(fc.get("disk"), pt.get("disk")))
    for _, fc, pt in paired(doc.get("tpch"), lambda r: (), lambda r: True):
        for ph in TPCH_PHASES:
            spread = max(spread, cpu_spread((fc.get(ph) or {}).get("disk"), (pt.get(ph) or {}).get("disk")))
    return stolen(*disks), spread


def cell(pairs):
    """One cell of the table from its pairs' rows, (ratio, target, note, disturbed) each: the
    median pair (the lower middle of an even count: one drifting pair of measurements cannot
    move it, as it moves a single ratio) of the undisturbed pairs (`upset`: steal at most
    STEAL_FLAG in both measurements, CPU checks within CPU_SPREAD), with their range and
    count, and the median and range of all of them where some were set aside; of all of them
    where none was left."""
    pairs = sorted(pairs, key=lambda x: x[0])
    clean = [x for x in pairs if not x[3]]
    chosen = clean or pairs
    ratio, target, note, _ = chosen[(len(chosen) - 1) // 2]
    if len(clean) == len(pairs) or not clean:
        if len(pairs) > 1:
            note += f" (median of {len(pairs)}: {pairs[0][0]:.2f}–{pairs[-1][0]:.2f})"
    else:
        every = pairs[(len(pairs) - 1) // 2][0]
        kept = (f"median of {len(clean)} undisturbed: {clean[0][0]:.2f}–{clean[-1][0]:.2f}" if len(clean) > 1
                else "the one undisturbed pair")
        note += f" ({kept}; all {len(pairs)}: {every:.2f}, {pairs[0][0]:.2f}–{pairs[-1][0]:.2f})"
    if target == "n/a":
        return f"{ratio:.1%} (n/a: reads kept on the disk)"
    if target is None:
        return f"{ratio:.1%}" if ratio >= 0.99 else f"**{ratio:.1%}**"
    # Two decimals, or three where two would round a miss up to its target.
    shown = f"{ratio:.3f}" if ratio < target <= round(ratio, 2) else f"{ratio:.2f}"
    return (shown if ratio >= target else f"**{shown}**") + note


def collect(root):
    """Every cell's pairs under one results directory: {workload: {column: [(ratio, target,
    note, disturbed), ...]}}, a column being a profile and, past 1 Gbit/s, its link."""
    table = {}
    docs = {}
    paths = glob.glob(os.path.join(root, "*", "paper-*.json")) + glob.glob(os.path.join(root, "*", "rep*", "paper-*.json"))
    for path in sorted(paths):
        with open(path) as f:
            doc = json.load(f)
        opts = doc.get("options", {})
        prof = opts.get("profile", "?")
        link = opts.get("link_rate") or "1gbit"
        col = prof if link == "1gbit" else f"{prof} {link}"
        rep = re.search(r"/rep(\d+)/", path)
        doc["_rep"] = int(rep[1]) if rep else 0
        docs.setdefault(col, []).append(doc)
    for col, col_docs in docs.items():
        prof = col.split()[0]
        base = [d for d in docs.get(prof, []) if d.get("tpch")]
        for doc in col_docs:
            # A farcache-only job's pair K borrows the passthrough of the 1 Gbit/s job's pair K
            # (run in the same round), else its first.
            same = [d for d in base if d["_rep"] == doc["_rep"]]
            for name, ratio, target, note, st in ratios(doc, (same or base or [None])[0]):
                table.setdefault(name, {}).setdefault(col, []).append((ratio, target, note, st))
    return table


def sign_test(below, above):
    """Two-sided exact sign test: the chance of a split at least this uneven between pairs
    below and above 1 if each pair were as likely to fall on either side (no effect)."""
    n = below + above
    if n == 0:
        return 1.0
    k = min(below, above)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def pooled(roots):
    """Each speed cell's pairs pooled over several table runs (ROOTS: results directories of
    scripts/bench-nothing-slower.sh): a cell that one run's median puts below its target may be
    that run's drift or a systematic loss, and many pairs tell them apart where three cannot.
    Prints per cell the pairs, their median and geometric mean, how many fell below the
    target, and the sign test of pairs below against above 1 (disturbed pairs included: the
    runs' own marks say which)."""
    if not roots:
        print("nothing-slower-table: --pooled needs one or more results directories", file=sys.stderr)
        return 2
    cells = {}
    for root in roots:
        if not os.path.isdir(root):
            print(f"nothing-slower-table: no directory {root}", file=sys.stderr)
            return 2
        for name, cols in collect(root).items():
            for col, rows in cols.items():
                cells.setdefault((name, col), []).extend(r for r in rows if isinstance(r[1], float))
    cells = {k: v for k, v in cells.items() if v}
    if not cells:
        print(f"no results under {', '.join(roots)}", file=sys.stderr)
        return 1
    print(f"Pairs pooled over {len(roots)} runs: " + ", ".join(roots))
    print()
    print("| workload | disk | pairs | median | geometric mean | below target | below / above 1 | sign test p |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (name, col), rows in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        r = sorted(x[0] for x in rows)
        target = rows[0][1]
        med = r[(len(r) - 1) // 2]
        gm = math.exp(sum(math.log(x) for x in r) / len(r))
        below, above = sum(x < 1 for x in r), sum(x > 1 for x in r)
        print(f"| {name} | {col} | {len(r)} | {med:.3f} | {gm:.3f} | {sum(x < target for x in r)} of {len(r)} "
              f"| {below} / {above} | {sign_test(below, above):.2f} |")
    return 0


def main():
    if sys.argv[1:2] == ["--disturbed"]:
        # For scripts/bench-nothing-slower.sh: exit 0 when one of the documents' measurements
        # lost more than STEAL_FLAG of the machine to steal or its CPU checks moved more than
        # CPU_SPREAD (1 when neither), and say how much.
        worst, spread = 0.0, 1.0
        for path in sys.argv[2:]:
            try:
                with open(path) as f:
                    st, sp = disturbed(json.load(f))
            except (OSError, ValueError) as e:
                print(f"nothing-slower-table: cannot read {path}: {e}", file=sys.stderr)
                return 2
            worst, spread = max(worst, st), max(spread, sp)
        print(f"{worst:.1%} of the machine's CPU time stolen at most, CPU checks {spread:.2f}× apart at most")
        return 0 if worst > STEAL_FLAG or spread > CPU_SPREAD else 1
    if sys.argv[1:2] == ["--pooled"]:
        return pooled(sys.argv[2:])
    root = sys.argv[1] if len(sys.argv) > 1 else "bench/results/nothing-slower"
    table = collect(root)
    if not table:
        print(f"no results under {root}", file=sys.stderr)
        return 1
    profs = [p for p in PROFILES if any(p in row for row in table.values())]
    profs += sorted({c for row in table.values() for c in row} - set(profs))
    print("| workload | " + " | ".join(profs) + " |")
    print("|---|" + "---:|" * len(profs))
    def order(name):
        # By experiment, then sizes and client counts as numbers (256MiB before 1GiB; 1, 4, 16).
        def key(w):
            m = re.fullmatch(r"(\d+)(MiB|GiB)?", w)
            return (0, int(m[1]) << (10 if m[2] == "GiB" else 0)) if m else (1, w)
        return [key(w) for w in name.split()]

    for name in sorted(table, key=order):
        cells = []
        for p in profs:
            if p not in table[name]:
                cells.append("–")
                continue
            cells.append(cell(table[name][p]))
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nfarcache ÷ passthrough (performance: > 1 is farcache faster), one `bench paper` invocation")
    print("per profile, link and experiment; **bold**: below its target (0.97; TPC-B at 4 and 16")
    print("clients 1.0; hit ratios 99%, the page cache + lenders one only where the lenders are faster")
    print("than the disk; at 10 Gbit/s seqread pass 2 3.0 where the file is larger than the client, and tpch power")
    print("and throughput 5.0).")
    print("†: the rest of the machine moved that much on the disk under the loop device, at more than")
    print("16 MiB/s, during one of the two measurements (a build, a copy): not comparable.")
    print("‡: the rest of the machine used that many more (+) or fewer (-) CPUs during farcache's")
    print("measurement than during the passthrough's (a build beside one of them): not comparable.")
    print(f"§: the disk itself ran at different speeds: its slowest check (4 KiB O_DIRECT reads by the")
    print(f"harness at the start and end of each measurement) took that many times its fastest (> {DISK_SPREAD}):")
    print("a shared machine's disk, moved by other machines: not comparable.")
    print(f"¶: the hypervisor took that share of the machine's CPU time (steal, > {STEAL_FLAG:.0%}) during one")
    print("of the measurements: a shared machine's vCPUs, taken by other guests: not comparable.")
    print("(median of N: lo–hi): a repeated job, N pairs spread over the run (odd ones passthrough first,")
    print("even ones farcache first, since scripts/bench-nothing-slower.sh of session 44);")
    print(f"◊: the machine's CPU ran at different speeds: its slowest check (a fixed loop timed by the harness")
    print(f"at the start and end of each measurement) took that many times its fastest (> {CPU_SPREAD}): not comparable.")
    print("the median pair's ratio and marks, and the range of all N. (median of K undisturbed: lo–hi;")
    print(f"all N: m, lo–hi): the median of the K pairs without ¶ or ◊ (pairs with either are measured")
    print("again: RETRY), and of all N, shown beside it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
