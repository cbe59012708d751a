#!/usr/bin/env python3
"""Plots of `farcache bench paper` results in the style of paper 000's figures 2 and 3:
farcache's performance ratio per access size, 1st and 2nd pass, against passthrough
(= 1.00, the paper's "method disabled") and against ideal (no memory limit).

usage: scripts/bench-paper-plot.py bench/results/paper-cloud.json [...]
writes bench/results/paper-cloud-seqread.png, paper-cloud-randread.png, ... beside each JSON
(pgbench: tps ratios; tpch: load/power/throughput ratios and the power test per query;
migrate: each disk's utilization and the foreground's throughput over time; tenants: each
tenant's target and use at the lender over time per allocation mode, paper 004's Fig. 4, one
PNG per capacity point, -tenants-<share>.png; oltp: paper 002's OLTP figures, tpmC against
connections per configuration, by the loop device's scheduler and by CPUs, -oltp.png; engine,
serial: paper 002's IOPS / native per queue depth and the serialization test, -engine.png;
postmark, dfsio, durable, destage: paper 003's figures, each case per configuration and its
ratio to native, -<experiment>.png).
"""
import json
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("bench-paper-plot: matplotlib missing (scripts/bench-deps.sh installs it); no plots", file=sys.stderr)
    sys.exit(0)

TITLES = {
    "seqread": "Sequential read (paper 000, Table 4 / Fig. 2)",
    "randread": "Random 4 KiB read (paper 000, Tables 5-6 / Fig. 3)",
}


def human(n):
    return f"{n >> 30}GiB" if n >= 1 << 30 and n % (1 << 30) == 0 else f"{n >> 20}MiB"


def secs(report, exp, size, cfg, p):
    for r in report["runs"]:
        if r["experiment"] == exp and r["size_bytes"] == size and r["config"] == cfg and not r.get("error"):
            for x in r["passes"]:
                if x["pass"] == p and x["secs"] > 0:
                    return x["secs"]
    return None


def ratio(report, exp, size, base, p):
    f, b = secs(report, exp, size, "farcache", p), secs(report, exp, size, base, p)
    return b / f if f and b else float("nan")


def tps(report, cfg, mode, clients):
    for x in report.get("pgbench", []):
        if x["config"] == cfg and x["mode"] == mode and x["clients"] == clients and not x.get("error"):
            return x["tps"] if x["tps"] > 0 else None
    return None


def ratio_bars(ax, labels, series, ylabel):
    """Grouped bars of (ratios, name) series over `labels`, each bar annotated, a line at 1."""
    x = range(len(labels))
    if not series:
        # Nothing to compare against (a run without the baseline configuration).
        ax.text(0.5, 0.5, "no baseline in this run", ha="center", va="center", transform=ax.transAxes)
        ax.set_ylabel(ylabel)
        return
    w = 0.8 / len(series)
    for i, (ys, name) in enumerate(series):
        bars = ax.bar([v + (i - (len(series) - 1) / 2) * w for v in x], ys, w, label=name)
        for b, y in zip(bars, ys):
            if y == y:
                ax.annotate(f"{y:.2f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)


def plot_pgbench(report, png):
    o = report["options"]
    # Every configuration against the passthrough (farcache also against ideal, paper 000's
    # figure; the tier's configurations are paper 003's TPC-B point).
    others = [c for c in o.get("configs", []) if c not in ("passthrough", "ideal", "native")] or ["farcache"]
    labels = []
    series = {f"{c} / passthrough": [] for c in others}
    if "ideal" in o.get("configs", []) and "farcache" in others:
        series["farcache / ideal"] = []
    for mode in ["select-only", "tpc-b"]:
        for c in o.get("pgbench_clients", []):
            labels.append(f"{mode}\n{c} clients")
            for name, ys in series.items():
                cfg, base = name.split(" / ")
                f, b = tps(report, cfg, mode, c), tps(report, base, mode, c)
                ys.append(f / b if f and b else float("nan"))
    fig, ax = plt.subplots(figsize=(11, 4))
    ratio_bars(ax, labels, [(ys, name) for name, ys in series.items()], "tps ratio")
    setup = report.get("pgbench_setup") or {}
    fig.suptitle(
        f"pgbench: scale {setup.get('scale', '?')}, client {human(o['memory_bytes'])}, disk {o['profile']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def tpch_rec(report, cfg):
    for x in report.get("tpch", []):
        if x.get("config") == cfg and not x.get("error"):
            return x
    return None


def tpch_ratios(report, base):
    f, b = tpch_rec(report, "farcache"), tpch_rec(report, base)
    if not f or not b:
        return [float("nan")] * 3

    def div(a, c):
        return a / c if a and c else float("nan")

    return [
        div(b.get("load_secs"), f.get("load_secs")),
        div(b.get("power_secs"), f.get("power_secs")),
        div(f.get("queries_per_hour"), b.get("queries_per_hour")),
    ]


def plot_tpch(report, png):
    o = report["options"]
    fig, (ax, axq) = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [1, 2.4]})
    labels = ["load test\n(time)", "power test\n(time)", "throughput test\n(queries/h)"]
    series = [(tpch_ratios(report, base), f"farcache / {base}") for base in ["passthrough", "ideal"]]
    ratio_bars(ax, labels, series, "performance ratio (> 1: farcache better)")
    # The power test query by query, in the stream's order: passthrough's time / farcache's.
    f, p = tpch_rec(report, "farcache"), tpch_rec(report, "passthrough")
    qs, ys = [], []
    if f and p:
        pt = {q["query"]: q for q in p["power"]}
        for q in f["power"]:
            b = pt.get(q["query"])
            ok = q["status"] == "ok" and b and b["status"] == "ok" and q["secs"] > 0
            qs.append(f"Q{q['query']}")
            ys.append(b["secs"] / q["secs"] if ok else float("nan"))
    bars = axq.bar(range(len(qs)), ys, 0.7, color="tab:green")
    for b, y in zip(bars, ys):
        if y == y:
            axq.annotate(f"{y:.2f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=6)
    axq.axhline(1.0, color="grey", lw=0.8, ls="--")
    axq.set_xticks(range(len(qs)))
    axq.set_xticklabels(qs, fontsize=7)
    axq.set_ylabel("passthrough time / farcache time")
    axq.set_title("power test, per query (stream 0 order)", fontsize=9)
    setup = report.get("tpch_setup") or {}
    db = max([x.get("database_bytes", 0) for x in report.get("tpch", [])] or [0])
    fig.suptitle(
        f"tpch (paper 000, Tables 8/10): SF {setup.get('scale_factor', '?')}, database {db / (1 << 20):.0f} MiB, "
        f"client {human(o['memory_bytes'])}, lender {human(setup.get('lender_capacity_bytes', 0))}, disk {o['profile']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def per_second(samples, key, b):
    """(t, share of each second) of a cumulative per-branch counter in ms."""
    t, y = [], []
    for p, q in zip(samples, samples[1:]):
        dt = (q["t_secs"] - p["t_secs"]) * 1000.0
        if dt < 500:
            continue  # a boundary reading, not a second
        t.append(q["t_secs"])
        y.append(min(1.0, (q[key][b] - p[key][b]) / dt))
    return t, y


def plot_migrate(report, png):
    """Paper 001's Figs. 14-17: each disk's utilization over time, and the foreground's
    throughput, per copy source and thread count; the migration shaded."""
    runs = [r for r in report["migrate_runs"] if not r.get("error")]
    if not runs:
        return False
    fig, axes = plt.subplots(len(runs), 2, figsize=(12, 2.2 * len(runs)), squeeze=False)
    for row, r in zip(axes, runs):
        s = sorted(r["samples"], key=lambda q: q["t_secs"])
        # Whole seconds only (the migration's start and end are extra readings).
        secs = [s[0]]
        for q in s[1:]:
            if q["t_secs"] - secs[-1]["t_secs"] >= 0.5:
                secs.append(q)
        s = secs
        for b in range(2):
            t, y = per_second(s, "daemon_busy_ms", b)
            row[0].plot(t, y, label=f"disk {b + 1}")
        t = [q["t_secs"] for q in s[1:]]
        mbps = [
            (q["fg_bytes"] - p["fg_bytes"]) / max(q["t_secs"] - p["t_secs"], 1e-9) / 1e6 for p, q in zip(s, s[1:])
        ]
        row[1].plot(t, mbps, color="black")
        for ax in row:
            ax.axvspan(r["migration_start_secs"], r["migration_end_secs"], color="orange", alpha=0.25)
        row[0].set_ylim(0, 1.05)
        row[0].set_ylabel(f"{r['source']}, T={r['threads']}\nutilization", fontsize=8)
        row[1].set_ylabel("foreground MB/s", fontsize=8)
        row[0].legend(fontsize=7, loc="lower left")
    axes[-1][0].set_xlabel("seconds (migration shaded)")
    axes[-1][1].set_xlabel("seconds (migration shaded)")
    o = report["options"]
    fig.suptitle(
        f"Migration of {o['migrate_files'] // 2} of {o['migrate_files']} files x 4 MiB between two {o['profile']} "
        "disks (paper 001, Figs. 14-17): per-disk utilization (daemon I/O time) and foreground throughput",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return True


def plot_tenants(report, stem):
    """Paper 004's Fig. 4: per allocation mode, each tenant's target (solid) and use (dashed)
    at the lender over time; one PNG per capacity point. The written paths."""
    runs = [r for r in report.get("tenants_runs", []) if not r.get("error") and r.get("samples")]
    out = []
    for frac in sorted({r["capacity_fraction"] for r in runs}):
        rows = [r for r in runs if r["capacity_fraction"] == frac]
        order = report["options"].get("tenants_modes") or [r["mode"] for r in rows]
        rows.sort(key=lambda r: order.index(r["mode"]) if r["mode"] in order else 99)
        fig, axes = plt.subplots(len(rows), 1, figsize=(8, 2.4 * len(rows)), sharex=True, squeeze=False)
        for ax, r in zip(axes[:, 0], rows):
            names = sorted({t["name"] for s in r["samples"] for t in s["tenants"]})
            for i, name in enumerate(names):
                color = f"C{i}"
                pts = [(s["t_secs"], t) for s in r["samples"] for t in s["tenants"] if t["name"] == name]
                xs = [p[0] for p in pts]
                sf = next((t["scale_factor"] for t in r["tenants"] if t["name"] == name), None)
                label = f"{name} (SF {sf:g})" if sf is not None else name
                if r["mode"] != "shared":
                    ax.plot(xs, [p[1]["target_bytes"] / 2**20 for p in pts], color=color, label=f"{label} target")
                ax.plot(xs, [p[1]["used_bytes"] / 2**20 for p in pts], color=color, linestyle="--",
                        label=f"{label} used")
            ax.axhline(r["capacity_bytes"] / 2**20, color="grey", linewidth=0.8)
            ax.set_ylabel("MiB")
            ax.set_title(f"{r['mode']}: total {r['total_secs']:.0f} s", fontsize=9)
            ax.legend(fontsize=6, ncol=3, loc="upper left")
        axes[-1, 0].set_xlabel("seconds since the queries started")
        fig.suptitle(
            f"Lender memory per tenant over time (paper 004, Fig. 4)\ncapacity {frac} x the databases "
            f"({rows[0]['capacity_bytes'] >> 20} MiB, grey); solid: target, dashed: used",
            fontsize=9,
        )
        fig.tight_layout()
        png = f"{stem}-tenants-{frac:g}.png"
        fig.savefig(png, dpi=110)
        plt.close(fig)
        out.append(png)
    return out


def oltp_tpmc(report, cfg, kind, conn, sched=None, cpus=None):
    for x in report.get("oltp", []):
        if (x["config"] == cfg and x["kind"] == kind and x["connections"] == conn and not x.get("error")
                and (sched is None or x["scheduler"] == sched) and (cpus is None or x["cpus"] == cpus)):
            return x["tpmc"] if x["tpmc"] > 0 else None
    return None


def plot_oltp(report, png):
    """Paper 002's OLTP figures: tpmC against connections per configuration (its Fig. of
    throughput by processes), tpmC per block-layer scheduler, and CPU scaling."""
    o = report["options"]
    setup = report.get("oltp_setup") or {}
    cfgs = [c for c in o["configs"] if any(x["config"] == c for x in report.get("oltp", []))]
    if not cfgs:
        return False
    fig, (ax, axs, axc) = plt.subplots(1, 3, figsize=(15, 4), gridspec_kw={"width_ratios": [1.3, 1, 0.8]})
    conns = o.get("oltp_connections", [])
    for c in cfgs:
        ys = [oltp_tpmc(report, c, "connections", n) for n in conns]
        ax.plot(conns, [y if y else float("nan") for y in ys], marker="o", label=c)
    ax.set_xscale("log", base=2)
    ax.set_xticks(conns)
    ax.set_xticklabels([str(n) for n in conns])
    ax.set_xlabel("connections (go-tpc threads)")
    ax.set_ylabel("tpmC (NewOrders per minute)")
    ax.set_ylim(bottom=0)
    ax.set_title("tpmC by connections", fontsize=9)
    ax.legend(fontsize=8)
    n = o.get("oltp_point_connections", 16)
    scheds = [s for s in o.get("oltp_schedulers", []) if s in setup.get("schedulers_available", [])]
    pcfgs = [c for c in cfgs if any(x["config"] == c and x["kind"] != "connections" for x in report["oltp"])]

    def bars(axis, labels, values_of, title, xlabel):
        w = 0.8 / max(len(pcfgs), 1)
        for i, c in enumerate(pcfgs):
            ys = [values_of(c, lab) or float("nan") for lab in labels]
            bs = axis.bar([v + (i - (len(pcfgs) - 1) / 2) * w for v in range(len(labels))], ys, w, label=c)
            for b, y in zip(bs, ys):
                if y == y:
                    axis.annotate(f"{y:.0f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
        axis.set_xticks(range(len(labels)))
        axis.set_xticklabels([str(x) for x in labels], fontsize=8)
        axis.set_xlabel(xlabel)
        axis.set_title(title, fontsize=9)
        axis.legend(fontsize=8, loc="best")

    bars(axs, scheds, lambda c, s: oltp_tpmc(report, c, "scheduler", n, sched=s),
         f"tpmC by the loop device's scheduler, {n} connections", "scheduler")
    cpus = [c for c in o.get("oltp_cpus", []) if 1 <= c <= setup.get("cpus_online", 0)]
    bars(axc, cpus, lambda c, k: oltp_tpmc(report, c, "cpus", n, cpus=k), f"tpmC by CPUs (cpuset), {n} connections",
         "CPUs")
    for c, x in zip(pcfgs, range(len(pcfgs))):
        lo = oltp_tpmc(report, c, "cpus", n, cpus=cpus[0]) if cpus else None
        hi = oltp_tpmc(report, c, "cpus", n, cpus=cpus[-1]) if cpus else None
        if lo and hi and len(cpus) > 1:
            axc.annotate(f"{c}: {hi / lo:.2f}x", (0.02, 0.95 - 0.07 * x), xycoords="axes fraction", fontsize=7)
    fig.suptitle(
        f"OLTP (paper 002, issue 11): go-tpc TPC-C on PostgreSQL 15, {setup.get('warehouses', '?')} warehouses "
        f"({(setup.get('data_bytes') or setup.get('database_bytes', 0)) / (1 << 20):.0f} MiB"
        f"{'' if setup.get('data_bytes') else ' with WAL'}), client {human(o['memory_bytes'])}, disk {o['profile']}, "
        f"{o.get('oltp_secs')} s per point",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def engine_rec(report, exp, cfg, **k):
    for x in report.get("engine_runs", []):
        if x.get("experiment") == exp and x.get("config") == cfg and not x.get("error"):
            if all(x.get(a) == b for a, b in k.items()):
                return x
    return None


def plot_engine(report, png):
    """Paper 002's engine figures: IOPS / native per queue depth (randread, randwrite; 1 and 4
    jobs on one file) per configuration, and the serialization test: IOPS and the disk's
    queue depth against processes."""
    runs = report.get("engine_runs", [])
    o = report["options"]
    cfgs = [c for c in o["configs"] if c != "native" and any(x.get("config") == c for x in runs)]
    eng = [x for x in runs if x.get("experiment") == "engine"]
    ser = [x for x in runs if x.get("experiment") == "serial"]
    if not eng and not ser:
        return False
    panels = [(rw, j) for rw in ("randread", "randwrite") for j in (1, 4)
              if any(x["rw"] == rw and x["jobs"] == j for x in eng)]
    # Two rows: reads above writes, 1 and 4 jobs side by side, the serialization test last.
    fig, grid = plt.subplots(2, 3, figsize=(12, 7.2), squeeze=False)
    slot = {("randread", 1): grid[0][0], ("randread", 4): grid[0][1],
            ("randwrite", 1): grid[1][0], ("randwrite", 4): grid[1][1]}
    for k, ax in slot.items():
        if k not in panels:
            ax.axis("off")
    for (rw, jobs) in panels:
        ax = slot[(rw, jobs)]
        qds = sorted({x["iodepth"] for x in eng if x["rw"] == rw and x["jobs"] == jobs})
        for c in cfgs:
            ys = []
            for q in qds:
                a = engine_rec(report, "engine", c, rw=rw, jobs=jobs, iodepth=q)
                b = engine_rec(report, "engine", "native", rw=rw, jobs=jobs, iodepth=q)
                ys.append(a["iops"] / b["iops"] if a and b and b["iops"] else float("nan"))
            if any(y == y for y in ys):
                ax.plot(qds, ys, marker="o", label=c)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.axhline(0.9, color="red", lw=0.6, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xticks(qds)
        ax.set_xticklabels([str(q) for q in qds])
        ax.set_xlabel("queue depth")
        ax.set_ylabel("IOPS / native")
        ax.set_title(f"{rw}, {jobs} job(s), 4 KiB", fontsize=9)
        ax.legend(fontsize=6)
    if not ser:
        grid[0][2].axis("off")
        grid[1][2].axis("off")
    else:
        axi, axq = grid[0][2], grid[1][2]
        procs = sorted({x["jobs"] for x in ser})
        for c in ["native"] + cfgs:
            pts = [engine_rec(report, "serial", c, jobs=p) for p in procs]
            if not any(pts):
                continue
            axi.plot(procs, [r["iops"] if r else float("nan") for r in pts], marker="o", label=c)
            axq.plot(procs, [r.get("disk_queue", float("nan")) if r else float("nan") for r in pts], marker="o", label=c)
        for ax, yl, t in [(axi, "IOPS", "serialization test: IOPS"), (axq, "disk queue depth", "serialization test: queue")]:
            ax.set_xscale("log", base=2)
            ax.set_xticks(procs)
            ax.set_xticklabels([str(p) for p in procs])
            ax.set_xlabel("processes (sync 8 KiB O_DIRECT reads, one file)")
            ax.set_ylabel(yl)
            ax.set_title(t, fontsize=9)
            ax.legend(fontsize=6)
    fig.suptitle(f"The backing I/O engine (paper 002, issue 11): disk {o['profile']}, fio on a "
                 f"{human(o.get('engine_file_bytes', 0))} file, {o.get('engine_secs')} s points", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


TIER_TITLES = {
    "postmark": "Postmark, Table 1's settings (paper 003, Fig. 7)",
    "dfsio": "TestDFSIO-like: write, then read back with caches dropped (paper 003, Fig. 8)",
    "durable": "Durable 4 KiB writes: pwrite + fdatasync (issue 12)",
    "destage": "Destage: write-back against the disk's own sequential write, and a durable writer's p99",
}


def plot_tier(report, exp, png):
    """Paper 003's figures: each case's rate per configuration, and each against native (the
    backing alone; the paper's "SSD only" = 1.00)."""
    runs = [r for r in report.get("tier_runs", []) if r.get("experiment") == exp and not r.get("error")]
    if not runs:
        return False
    o = report["options"]
    configs = [c for c in o.get("configs", []) if any(r["config"] == c for r in runs)]
    cases = list(dict.fromkeys(r["case"] for r in runs))
    rec = {(r["config"], r["case"]): r for r in runs}
    base = "native" if "native" in configs else configs[0]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    if exp == "destage":
        # Left: the write-back (tier) against the disk's sequential write (no tier), MB/s;
        # right: the durable writer's p99 while it runs and while nothing does.
        first = cases[0]
        ys = [rec[(c, first)]["per_sec"] if (c, first) in rec else float("nan") for c in configs]
        axes[0].bar(configs, ys, color=[f"C{i}" for i in range(len(configs))])
        for i, y in enumerate(ys):
            if y == y:
                axes[0].annotate(f"{y:.0f}", (i, y), ha="center", va="bottom", fontsize=7)
        axes[0].set_ylabel("MB/s")
        axes[0].set_title("written back (tier) / sequential write (no tier)", fontsize=9)
        axes[0].tick_params(axis="x", labelsize=8)
        later = cases[1:]
        w = 0.8 / max(1, len(later))
        for i, case in enumerate(later):
            ys = [(rec.get((c, case)) or {}).get("p99_us") or float("nan") for c in configs]
            bars = axes[1].bar([v + (i - (len(later) - 1) / 2) * w for v in range(len(configs))], ys, w, label=case)
            for b, y in zip(bars, ys):
                if y == y:
                    axes[1].annotate(f"{y:.0f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
        axes[1].set_xticks(list(range(len(configs))))
        axes[1].set_xticklabels(configs, fontsize=8)
        axes[1].set_ylabel("p99 µs")
        axes[1].set_title("durable writer's p99", fontsize=9)
        axes[1].legend(fontsize=8)
    else:
        x = range(len(cases))
        w = 0.8 / len(configs)
        for i, c in enumerate(configs):
            ys = [rec[(c, k)]["per_sec"] if (c, k) in rec else float("nan") for k in cases]
            axes[0].bar([v + (i - (len(configs) - 1) / 2) * w for v in x], ys, w, label=c)
        axes[0].set_xticks(list(x))
        axes[0].set_xticklabels(cases, fontsize=7)
        axes[0].set_ylabel(runs[0]["unit"])
        axes[0].legend(fontsize=8)
        series = []
        for c in configs:
            if c == base:
                continue
            ys = []
            for k in cases:
                a, b = rec.get((c, k)), rec.get((base, k))
                ys.append(a["per_sec"] / b["per_sec"] if a and b and b["per_sec"] > 0 else float("nan"))
            series.append((ys, f"{c} / {base}"))
        ratio_bars(axes[1], cases, series, f"ratio ({base} = 1.00)")
        axes[1].tick_params(axis="x", labelsize=7)
    fig.suptitle(f"{TIER_TITLES.get(exp, exp)}: disk {o['profile']}, client {human(o['memory_bytes'])}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def plot(path):
    report = json.load(open(path))
    o = report["options"]
    stem = os.path.splitext(path)[0]
    sizes = o["sizes_bytes"]
    out = []
    for exp in o["experiments"]:
        if exp == "tenants":
            out.extend(plot_tenants(report, stem))
            continue
        if exp in ("engine", "serial"):
            if exp == "engine" or "engine" not in o["experiments"]:
                if plot_engine(report, f"{stem}-engine.png"):
                    out.append(f"{stem}-engine.png")
            continue
        if exp == "oltp":
            if plot_oltp(report, f"{stem}-oltp.png"):
                out.append(f"{stem}-oltp.png")
            continue
        if exp == "migrate":
            if plot_migrate(report, f"{stem}-migrate.png"):
                out.append(f"{stem}-migrate.png")
            continue
        if exp in TIER_TITLES:
            if plot_tier(report, exp, f"{stem}-{exp}.png"):
                out.append(f"{stem}-{exp}.png")
            continue
        if exp == "pgbench":
            if report.get("pgbench"):
                plot_pgbench(report, f"{stem}-pgbench.png")
                out.append(f"{stem}-pgbench.png")
            continue
        if exp == "tpch":
            if report.get("tpch"):
                plot_tpch(report, f"{stem}-tpch.png")
                out.append(f"{stem}-tpch.png")
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
        x = range(len(sizes))
        w = 0.38
        for ax, base in zip(axes, ["passthrough", "ideal"]):
            for i, p in enumerate([1, 2]):
                ys = [ratio(report, exp, s, base, p) for s in sizes]
                bars = ax.bar([v + (i - 0.5) * w for v in x], ys, w, label=f"{'1st' if p == 1 else '2nd'} access")
                for b, y in zip(bars, ys):
                    if y == y:  # not NaN
                        ax.annotate(f"{y:.2f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax.set_xticks(list(x))
            ax.set_xticklabels([human(s) for s in sizes])
            ax.set_xlabel("access size")
            ax.set_ylabel(f"performance ratio (farcache vs {base} = 1.00)")
            ax.set_title(f"farcache / {base}")
            ax.legend(fontsize=8)
        link = o.get("link_rate") or "unshaped"
        fig.suptitle(
            f"{TITLES.get(exp, exp)}: disk {o['profile']}, client {human(o['memory_bytes'])}, "
            f"{o['lenders']} lender x {human(o['lender_capacity_bytes'])} over {link}",
            fontsize=9,
        )
        fig.tight_layout()
        png = f"{stem}-{exp}.png"
        fig.savefig(png, dpi=110)
        plt.close(fig)
        out.append(png)
    return out


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    for path in sys.argv[1:]:
        for png in plot(path):
            print(f"bench-paper-plot: wrote {png}")


if __name__ == "__main__":
    main()
