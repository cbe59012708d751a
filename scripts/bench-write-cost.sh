#!/usr/bin/env bash
# What the mount daemon spends on a write: 8 KiB O_DIRECT writes (`dd oflag=direct`: each one
# FUSE write, answered after the backing file has it) over a 16 MiB file on tmpfs (no disk:
# what is measured is the daemon's own work and the FUSE round trip), through a passthrough
# mount (--no-remote) and one farcache mount per binary in BINS (default routing, a lender on
# loopback), in ROUNDS rounds whose order rotates. Per write, from `perf stat -p DAEMON`
# while the writes run: the daemon's CPU time (task-clock), its stat calls (the statx,
# newfstat and newfstatat tracepoints: farcache's change stamp is one of them) and its
# context switches; and the write's wall time. Each pass of the file is one `dd` (one open and
# close of the file through the mount). Root (tmpfs mount); needs perf and dd.
# Writes $OUT/write-cost.{md,json}.
#   BINS    farcache binaries, space-separated (default target/release/farcache); the first
#           one also serves the passthrough mount
#   LABELS  their names in the table, space-separated (default: their file names)
#   WRITES  writes per measurement (default 16384: 8 passes of the file)
#   ROUNDS  rounds (default 5)
set -euo pipefail
BINS=${BINS:-target/release/farcache}
WRITES=${WRITES:-16384}
ROUNDS=${ROUNDS:-5}
OUT=${OUT:-bench/results}
SCRIPT=bench-write-cost
read -r -a bins <<<"$BINS"
read -r -a labels <<<"${LABELS:-}"
for i in "${!bins[@]}"; do
  [ -x "${bins[$i]}" ] || { echo "$SCRIPT: ${bins[$i]} missing (cargo build --release -p farcache-cli)" >&2; exit 1; }
  bins[$i]=$(realpath "${bins[$i]}")
  [ -n "${labels[$i]:-}" ] || labels[$i]=$(basename "${bins[$i]}")
done
[ "$(id -u)" = 0 ] || { echo "$SCRIPT: needs root (a tmpfs backing, perf of the daemons)" >&2; exit 1; }
command -v perf >/dev/null || { echo "$SCRIPT: perf missing (apt-get install -y linux-perf)" >&2; exit 1; }
[ $((WRITES % 2048)) = 0 ] && [ "$WRITES" -gt 0 ] || { echo "$SCRIPT: WRITES must be a multiple of 2048 (passes of the 16 MiB file)" >&2; exit 1; }
BIN=${bins[0]}
# shellcheck source=lib/bench-procs.sh
. "$(dirname "$0")/lib/bench-procs.sh"
mkdir -p "$OUT"
tmpfs_file_and_lender
rm -f "$work/backing/f"

# start_mount TAG BIN ARGS...: a mount of its own file (TAG) on the tmpfs backing.
declare -A pid
tags=()
start_mount() {
  local tag=$1 bin=$2
  shift 2
  mkdir -p "$work/mnt-$tag"
  head -c 16M /dev/zero >"$work/backing/w-$tag"
  "$bin" mount "$work/backing" "$work/mnt-$tag" "$@" >"$work/mount-$tag.out" 2>"$work/mount-$tag.log" &
  pid[$tag]=$!
  pids+=("$!")
  wait_for "$work/mount-$tag.out" "farcache mounted" "$!" 300
  tags+=("$tag")
}

start_mount passthrough "$BIN" --no-remote
for i in "${!bins[@]}"; do start_mount "${labels[$i]}" "${bins[$i]}" --server "$addr"; done

# passes TAG N: N passes of 2048 8 KiB direct writes over TAG's file, one dd each.
passes() {
  local f=$work/mnt-$1/w-$1
  for _ in $(seq "$2"); do dd if=/dev/zero of="$f" bs=8k count=2048 conv=notrunc oflag=direct status=none; done
}
export -f passes
export work

# Warm-up: one pass each (the first opens, the daemons' threads and buffers).
for tag in "${tags[@]}"; do passes "$tag" 1; done
n=${#tags[@]}
for r in $(seq "$ROUNDS"); do
  for k in $(seq 0 $((n - 1))); do
    tag=${tags[$(((k + r) % n))]}
    t0=$(date +%s%N)
    perf stat -x, -o "$work/perf-$tag-$r.csv" \
      -e task-clock,context-switches,syscalls:sys_enter_statx,syscalls:sys_enter_newfstat,syscalls:sys_enter_newfstatat \
      -p "${pid[$tag]}" -- bash -c "passes $tag $((WRITES / 2048))"
    echo "$(( $(date +%s%N) - t0 ))" >"$work/wall-$tag-$r"
  done
  echo "$SCRIPT: round $r/$ROUNDS done"
done

python3 - "$work" "$OUT" "$WRITES" "$ROUNDS" "${tags[*]}" <<'PY'
import json, statistics, sys
work, out, writes, rounds, tags = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split()

def perf(tag, r):
    got = {}
    for line in open(f"{work}/perf-{tag}-{r}.csv"):
        f = line.strip().split(",")
        if len(f) < 3 or line.startswith("#") or not f[0].replace(".", "", 1).isdigit():
            continue
        got[f[2].split(":")[-1]] = float(f[0])
    return got

res = {"writes": writes, "rounds": rounds, "mounts": {}}
for tag in tags:
    rows = []
    for r in range(1, rounds + 1):
        p = perf(tag, r)
        wall = int(open(f"{work}/wall-{tag}-{r}").read()) / 1e3
        stats = sum(p.get(k, 0) for k in ("sys_enter_statx", "sys_enter_newfstat", "sys_enter_newfstatat"))
        rows.append({"cpu_us": p["task-clock"] * 1e3 / writes, "wall_us": wall / writes,
                     "stat_calls": stats / writes, "switches": p.get("context-switches", 0) / writes})
    res["mounts"][tag] = {"rounds": rows, **{k: statistics.median(x[k] for x in rows) for k in rows[0]}}
m = res["mounts"]
base = m["passthrough"]
lines = [f"The mount daemon per 8 KiB O_DIRECT write (`dd oflag=direct`) of a 16 MiB file on tmpfs, "
         f"{writes} writes a measurement ({writes // 2048} opens and closes), median of {rounds} rounds "
         "(order rotating; range in brackets):", "",
         "| mount | daemon CPU µs a write | over the passthrough | stat calls a write | context switches a write | wall µs a write |",
         "|---|---:|---:|---:|---:|---:|"]
for tag in tags:
    x = m[tag]
    rng = lambda k: f"{min(r[k] for r in x['rounds']):.2f}–{max(r[k] for r in x['rounds']):.2f}"
    over = "–" if tag == "passthrough" else f"{x['cpu_us'] - base['cpu_us']:+.2f} ({x['cpu_us'] / base['cpu_us']:.3f}×)"
    lines.append(f"| {tag} | {x['cpu_us']:.2f} ({rng('cpu_us')}) | {over} | {x['stat_calls']:.3f} | "
                 f"{x['switches']:.2f} | {x['wall_us']:.1f} ({rng('wall_us')}) |")
text = "\n".join(lines) + "\n"
print(text)
open(f"{out}/write-cost.md", "w").write(text)
json.dump(res, open(f"{out}/write-cost.json", "w"), indent=1)
PY
