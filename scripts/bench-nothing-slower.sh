#!/usr/bin/env bash
# Issue 17's "Nothing gets slower" set: farcache (default settings) against the passthrough,
# side by side in one `farcache bench paper` invocation per job, where a job is a disk profile,
# an experiment and a link rate. Resumable: a job whose JSON is complete is skipped (delete it to
# run it again). Results: bench/results/nothing-slower/<profile>[-<link>]-<experiment>/.
#   JOBS       profile:experiment[:link] list (default: the issue's table, below)
#   SIZES      access sizes for seqread/randread       (default 256MiB,1GiB)
#   EXTRA      extra `bench paper` arguments, e.g. "--routing adaptive"
#   REPEAT     pairs per job (default 1). With N > 1 every job runs N times, each a fresh
#              pair in <job>/rep<K>/, the whole list once per K (so a job's pairs are spread
#              over the run), and the table takes each cell's median pair: on a shared machine
#              whose disk drifts by 2× within minutes (session 17), one pair can land on two
#              different disks. Odd pairs run the passthrough first, even pairs farcache first:
#              the second configuration of a long job runs on a disk the first has worked for
#              half an hour (raw tpch, session 44: farcache 0.69× the passthrough's power test
#              run second, 0.91× run first), so the order must not be always the same.
#   REPS       which of the REPEAT pairs to run this time (default all: "1 2 ... REPEAT"), e.g.
#              REPS=1 to finish every job's first pair before any second one, when a session
#              has time for only part of the run
#   RETRY      extra pairs a job may get, once its REPEAT pairs are done, while fewer than
#              REPEAT of them are undisturbed — the hypervisor stole more than 5% of the
#              machine's CPU time during one of a pair's measurements, or the CPU ran at speeds
#              more than 1.2x apart (below) (default 1; 0: none). Extra pairs are
#              rep<REPEAT+1>... (a 10 Gbit/s tpch extra pair borrows the 1 Gbit/s job's first
#              passthrough); scripts/nothing-slower-table.py sets disturbed pairs aside.
# The 10 Gbit/s tpch job runs farcache only: the passthrough sends nothing over the link, so
# scripts/nothing-slower-table.py compares it with the 1 Gbit/s job's passthrough (same profile,
# same scale factor, run right before). Time on the 2-CPU machine, one pair of every job: about
# 2 h 30 min (session 42: the seven short jobs 20 min, raw tpch 26, cloud tpch 48, hdd randread
# 42, 10 Gbit/s tpch 12).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/farcache}
OUT=${OUT:-bench/results/nothing-slower}
SIZES=${SIZES:-256MiB,1GiB}
JOBS=${JOBS:-"raw:randread raw:seqread raw:pgbench raw:tpch cloud:randread cloud:seqread cloud:pgbench cloud:tpch hdd:randread cloud:seqread:10gbit cloud:tpch:10gbit"}
if [ "$(id -u)" != 0 ]; then
  echo "bench-nothing-slower: needs root (loop devices, cgroups, network namespaces)" >&2
  exit 1
fi
"$BIN" bench paper --cleanup
REPEAT=${REPEAT:-1}
case $REPEAT in '' | *[!0-9]* | 0) echo "bench-nothing-slower: REPEAT must be a positive count, not '$REPEAT'" >&2; exit 2 ;; esac
RETRY=${RETRY:-1}
case $RETRY in '' | *[!0-9]*) echo "bench-nothing-slower: RETRY must be a count (0: no pair measured again), not '$RETRY'" >&2; exit 2 ;; esac
REPS=${REPS:-$(seq 1 "$REPEAT")}
for rep in $REPS; do
  case $rep in '' | *[!0-9]* | 0) echo "bench-nothing-slower: REPS must list pair numbers 1..$REPEAT, not '$rep'" >&2; exit 2 ;; esac
  [ "$rep" -le "$REPEAT" ] || { echo "bench-nothing-slower: REPS has $rep, past REPEAT=$REPEAT" >&2; exit 2; }
done
# The directory of pair REP of JOB (a job measured once has no rep<K> level for its first pair).
pair_dir() {
  local job=$1 rep=$2 prof exp link dir
  IFS=: read -r prof exp link <<<"$job"
  link=${link:-1gbit}
  dir="$OUT/$prof-$exp"
  [ "$link" != 1gbit ] && dir="$OUT/$prof-$link-$exp"
  if [ "$REPEAT" -gt 1 ] || [ "$rep" -gt 1 ]; then dir="$dir/rep$rep"; fi
  echo "$dir"
}

# `bench paper` writes its JSON after each configuration: only a complete one means the pair is
# done (one stopped between its two configurations would otherwise be skipped with half a pair).
complete() { grep -qs '"complete": true' "$1"/paper-*.json; }

run_pair() {
  local job=$1 rep=$2 prof exp link configs dir
  IFS=: read -r prof exp link <<<"$job"
  link=${link:-1gbit}
  configs=passthrough,farcache
  [ $((rep % 2)) -eq 0 ] && configs=farcache,passthrough
  [ "$link" != 1gbit ] && [ "$exp" = tpch ] && configs=farcache
  dir=$(pair_dir "$job" "$rep")
  if complete "$dir"; then
    echo "== $job pair $rep: done before ($dir), skipped"
    return 0
  fi
  mkdir -p "$dir"
  echo "== $job pair $rep ($(date +%T))"
  # shellcheck disable=SC2086
  "$BIN" bench paper --profile "$prof" --experiment "$exp" --sizes "$SIZES" --link "$link" \
    --configs "$configs" --out "$dir" ${EXTRA:-} >"$dir/log" 2>&1 ||
    { echo "   failed: see $dir/log"; rm -f "$dir"/paper-*.json; }
}

for rep in $REPS; do
  for job in $JOBS; do run_pair "$job" "$rep"; done
done

# Disturbed pairs: a pair one of whose measurements lost more than the harness's STEAL_FLAG (5%)
# of the machine's CPU time to steal, or whose CPU checks (a fixed loop the harness times at the
# start and end of each measurement) are more than CPU_CHECK_SPREAD (1.2x) apart, is not
# comparable: on two vCPUs every wake-up waits for one, and the steal or the slower host falls
# on one configuration's measurement, not both (session 48's table had steal in 12 of 21 pairs,
# up to 37%; pgbench at one client did 26% fewer transactions in one passthrough run than in
# another with the same CPU time and no steal). So once a job's REPEAT pairs are all done, it
# gets up to RETRY more pairs (orders alternating as before) until REPEAT of them are
# undisturbed. The table sets the disturbed ones aside from its medians and shows them beside.
for job in $JOBS; do
  all_done=1
  for rep in $(seq 1 "$REPEAT"); do complete "$(pair_dir "$job" "$rep")" || all_done=0; done
  [ "$all_done" = 1 ] || continue
  rep=$REPEAT
  while :; do
    clean=0
    for k in $(seq 1 "$rep"); do
      dir=$(pair_dir "$job" "$k")
      complete "$dir" || continue
      if steal=$(python3 scripts/nothing-slower-table.py --disturbed "$dir"/paper-*.json); then
        echo "== $job pair $k: disturbed ($steal)"
      else
        clean=$((clean + 1))
      fi
    done
    [ "$clean" -ge "$REPEAT" ] && break
    [ "$rep" -ge $((REPEAT + RETRY)) ] && { echo "== $job: $clean undisturbed pairs of $rep, RETRY=$RETRY spent"; break; }
    rep=$((rep + 1))
    run_pair "$job" "$rep"
  done
done
