#!/usr/bin/env bash
# What the mount daemon's own code costs per read, in instructions (callgrind counts them the
# same run after run, where the CPU time of a ~40 µs FUSE read moves by half between runs on
# this shared machine): 4 KiB O_DIRECT random reads of a 64 MiB file on tmpfs (no disk: the
# backing is far faster than a lender, as a host-cached or NVMe disk is), through a
# passthrough mount (--no-remote) and a farcache mount with a lender on loopback, both under
# `valgrind --tool=callgrind` with the synchronous backing engine (io_engine = "sync":
# valgrind does not run io_uring's kernel-side work, and the instructions counted are the
# daemon's own either way). Three cases:
#   disk  farcache's default (adaptive) routing: every read stays on the disk (the tmpfs is
#         faster than a lender hit); what the engine adds to a read it does not serve.
#   fill  --routing threshold: every read asks the lenders, misses, is widened to its
#         read-around window and filled; what a filled block costs the daemon.
#   stream  a sequential read of the whole file through the page cache (cold: the file's
#         cached pages dropped first), as a database's scans read: the kernel's readahead
#         asks the daemon for 1 MiB at a time, and farcache's default routing keeps the
#         stream on the disk; counted per MiB against a passthrough read the same way (a
#         mount of its own). What the engine adds to a stream it does not serve.
# Counted between `callgrind_control -z` and `-d` around one pass of READS reads (the stream
# case: one cold read of the whole file), after a warm-up pass, with the engine's counters
# before and after (a pass whose routing moved is seen there). Kernel time (the FUSE device,
# the copies, TCP) is not counted: that is what the wall-clock benchmarks measure. Writes
# $OUT/read-cost.{md,json}. Root (tmpfs mount); needs valgrind (scripts/bench-deps.sh
# installs it). Part of `make bench`, under 30 s.
#   BIN    the farcache binary (default target/release/farcache)
#   READS  reads in the measured pass (default 2048)
#   CASES  default "disk fill stream"
#   LABEL  names the build in the output (default: the checkout's commit)
set -euo pipefail
BIN=${BIN:-target/release/farcache}
READS=${READS:-2048}
OUT=${OUT:-bench/results}
CASES=${CASES:-disk fill stream}
SCRIPT=bench-read-cost
[ -x "$BIN" ] || { echo "bench-read-cost: $BIN missing (cargo build --release -p farcache-cli)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "bench-read-cost: needs root (a tmpfs backing)" >&2; exit 1; }
command -v valgrind >/dev/null && command -v callgrind_control >/dev/null ||
  { echo "bench-read-cost: valgrind missing (scripts/bench-deps.sh, or apt-get install -y valgrind)" >&2; exit 1; }
BIN=$(realpath "$BIN")
# shellcheck source=lib/bench-procs.sh
. "$(dirname "$0")/lib/bench-procs.sh"
mkdir -p "$OUT"
tmpfs_file_and_lender
printf '[mount]\nio_engine = "sync"\nthreads = 4\n' >"$work/mount.toml"

# start_mount TAG ARGS...: a mount under callgrind, its pid in pid[TAG] (up to 90 s to start:
# valgrind is slow to).
declare -A pid
start_mount() {
  local tag=$1
  shift
  mkdir -p "$work/mnt-$tag"
  valgrind --tool=callgrind --callgrind-out-file="$work/cg-$tag.%p" \
    "$BIN" mount "$work/backing" "$work/mnt-$tag" --config "$work/mount.toml" "$@" \
    >"$work/mount-$tag.out" 2>"$work/mount-$tag.log" &
  pid[$tag]=$!
  pids+=("$!")
  wait_for "$work/mount-$tag.out" "farcache mounted" "$!" 900
}

# drop_pages TAG: forget the page cache's copy of mnt-TAG/f, so that its next read is cold.
drop_pages() {
  dd if="$work/mnt-$1/f" iflag=nocache count=0 2>/dev/null
}

# measure TAG: callgrind's count of one pass through mnt-TAG — READS random reads, or for the
# stream mounts (pass-stream, stream) one cold sequential read of the whole file — annotated
# into $work/TAG.annotate, with the mount's counters around it.
measure() {
  local tag=$1 f
  "$BIN" stats "$work/mnt-$tag" --json >"$work/$tag-before.json"
  case $tag in *stream) drop_pages "$tag" ;; esac
  callgrind_control -z "${pid[$tag]}" >/dev/null 2>&1
  case $tag in
    *stream) dd if="$work/mnt-$tag/f" of=/dev/null bs=1M 2>/dev/null ;;
    *) "$BIN" randread "$work/mnt-$tag/f" --passes 1 --size "$((READS * 4))KiB" --seed 7 >/dev/null ;;
  esac
  callgrind_control -d measured "${pid[$tag]}" >/dev/null 2>&1
  "$BIN" stats "$work/mnt-$tag" --json >"$work/$tag-after.json"
  for _ in $(seq 100); do
    f=$(ls "$work"/cg-"$tag".*.1 2>/dev/null | head -1)
    [ -n "$f" ] && [ -s "$f" ] && break
    sleep 0.1
  done
  callgrind_annotate --threshold=100 "$f" 2>/dev/null >"$work/$tag.annotate"
  cp "$f" "$OUT/read-cost-$tag.callgrind"
}

start_mount pass --no-remote
for c in $CASES; do
  case $c in
    disk) start_mount disk --server "$addr" ;;
    fill) start_mount fill --server "$addr" --routing threshold ;;
    stream) start_mount pass-stream --no-remote && start_mount stream --server "$addr" ;;
    *) echo "bench-read-cost: unknown case $c (disk, fill, stream)" >&2; exit 1 ;;
  esac
done
# Warm-up: the passthrough and the disk case read 16 MiB of their file (the rule settles on
# the disk); the fill case reads one block, so that its measured pass misses everywhere; the
# stream mounts read the whole file twice, cold (the rule times both sides of a stream and
# seeds the lenders for its probes: what a scan pays once, not per MiB).
"$BIN" randread "$work/mnt-pass/f" --passes 1 --size 16MiB >/dev/null
tags=(pass)
for c in $CASES; do
  case $c in
    stream)
      for t in pass-stream stream; do
        for _ in 1 2; do
          drop_pages "$t"
          dd if="$work/mnt-$t/f" of=/dev/null bs=1M 2>/dev/null
        done
      done
      tags+=(pass-stream stream)
      ;;
    *)
      "$BIN" randread "$work/mnt-$c/f" --passes 1 --size "$([ "$c" = fill ] && echo 4KiB || echo 16MiB)" >/dev/null
      tags+=("$c")
      ;;
  esac
done
for tag in "${tags[@]}"; do measure "$tag"; done

python3 - "$work" "$OUT" "$READS" "$CASES" "$(stat -c %s "$work/backing/f")" "${LABEL:-$(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)}" <<'PY'
import json, re, sys
work, out, reads, cases, file_bytes, commit = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(), int(sys.argv[5]), sys.argv[6]
HASH = re.compile(r"sip\.rs|hash/random\.rs|foldhash|BuildHasher::hash_one|Hash for")

def annotate(tag):
    total, hashing = 0, 0
    for line in open(f"{work}/{tag}.annotate"):
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)", line)
        if not m:
            continue
        ir = int(m.group(1).replace(",", ""))
        if "PROGRAM TOTALS" in m.group(2):
            total = ir
        elif HASH.search(m.group(2)):
            hashing += ir
    return total, hashing

def stats(tag, when):
    return json.load(open(f"{work}/{tag}-{when}.json"))

def deltas(tag):
    a, b = stats(tag, "before").get("engine", {}), stats(tag, "after").get("engine", {})
    return {k: b[k] - a[k] for k in b if isinstance(b[k], int) and b[k] != a.get(k)}

def fuse_reads(tag):
    return stats(tag, "after")["fuse"]["ops"]["read"] - stats(tag, "before")["fuse"]["ops"]["read"]

res = {"commit": commit, "reads": reads, "pass": dict(zip(("ir", "hashing_ir"), annotate("pass")))}
rows = [f"| passthrough (`--no-remote`) | {res['pass']['ir'] / reads:,.0f} | – | {res['pass']['hashing_ir'] / reads:,.0f} | – |"]
for c in (c for c in cases if c != "stream"):
    ir, h = annotate(c)
    d = deltas(c)
    res[c] = {"ir": ir, "hashing_ir": h, "counters": d}
    extra = (ir - res["pass"]["ir"]) / reads
    fills = d.get("fills", 0)
    per_fill = f"{(ir - res['pass']['ir']) / fills:,.0f} a filled block ({fills} filled)" if c == "fill" and fills else \
        f"disk reads {d.get('adaptive_disk', 0)}, fills {fills}"
    what = {"disk": "farcache, default routing (reads kept on the disk)",
            "fill": "farcache, `--routing threshold` (every read a miss, filled)"}[c]
    rows.append(f"| {what} | {ir / reads:,.0f} | +{extra:,.0f} | {h / reads:,.0f} | {per_fill} |")
lines = [f"Instructions of the mount daemon (callgrind) per 4 KiB O_DIRECT random read of a 64 MiB file "
         f"on tmpfs, one pass of {reads} reads, build {commit}.", "",
         "| mount | instructions a read | over the passthrough | of which hashing | engine counters over the pass |",
         "|---|---:|---:|---:|---|", *rows]
if "stream" in cases:
    mib = file_bytes / (1 << 20)
    for tag in ("pass-stream", "stream"):
        ir, h = annotate(tag)
        res[tag] = {"ir": ir, "hashing_ir": h, "fuse_reads": fuse_reads(tag), "counters": deltas(tag)}
    p, s = res["pass-stream"], res["stream"]
    d = s["counters"]
    lines += ["", f"The same daemons' instructions for one cold sequential read of the whole file ({mib:.0f} MiB through "
              "the page cache, `dd bs=1M`; the kernel's readahead asks the daemon for up to 1 MiB a request):", "",
              "| mount | FUSE reads | instructions a MiB | a FUSE read | over the passthrough, a MiB | engine counters over the pass |",
              "|---|---:|---:|---:|---:|---|",
              f"| passthrough (`--no-remote`) | {p['fuse_reads']} | {p['ir'] / mib:,.0f} | {p['ir'] / max(p['fuse_reads'], 1):,.0f} | – | – |",
              f"| farcache, default routing (the stream kept on the disk) | {s['fuse_reads']} | {s['ir'] / mib:,.0f} | "
              f"{s['ir'] / max(s['fuse_reads'], 1):,.0f} | +{(s['ir'] - p['ir']) / mib:,.0f} | "
              f"disk reads {d.get('adaptive_disk', 0)}, fills {d.get('fills', 0)}, probes {d.get('adaptive_probes', 0)} |"]
text = "\n".join(lines) + "\n"
print(text)
open(f"{out}/read-cost.md", "w").write(text)
json.dump(res, open(f"{out}/read-cost.json", "w"), indent=1)
PY
