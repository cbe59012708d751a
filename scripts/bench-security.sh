#!/usr/bin/env bash
# The cost of TLS and block encryption on lender hits (issue 5), and a memcached lender against
# a farcache one (issue 16), every mode side by side in one run. Part of `make bench`; also
# `scripts/bench-security.sh` on its own.
#
# For each mode a real `farcache server` (slot_bytes 4160, room for sealed blocks) and a
# `farcache mount` of one shared backing directory are started, all at once:
#   plain      plain TCP, blocks in plaintext            (the baseline)
#   key        plain TCP, block encryption (--key-file)
#   tls        TLS 1.3 with certificates (farcache certs)
#   tls-psk    TLS 1.3 from a pre-shared key (--tls-psk-file)
#   tls+key    TLS 1.3 with certificates and block encryption
#   mc         a memcached lender (memcached://), blocks in plaintext (--memcached-plaintext)
#   mc+key     a memcached lender, block encryption
# MODES picks the modes (default: the first five); NAME names the result files (default
# security). `make bench` runs it twice: the security modes, then MODES="plain key mc mc+key"
# NAME=memcached. PAR=N (default 1) adds a throughput round per mode: N readers at once,
# different random sequences, their reads/s summed.
# A warm-up pass fills each lender; then ROUNDS rounds of one `farcache randread` pass of
# 4 KiB O_DIRECT reads per mode, in an order that rotates every round, so that a noisy
# neighbour hurts every mode alike. Every read is a lender hit (checked in the mount's stats).
# Reports the median reads/s and p50/p99 latency per mode and the ratio to `plain`, as
# markdown (stdout and bench/results/security.md) and JSON (bench/results/security.json).
# Cleans up after itself, also when interrupted.
set -euo pipefail
BIN=${BIN:-target/release/farcache}
ROUNDS=${ROUNDS:-8}
READ=${READ:-64MiB}
OUT=${OUT:-bench/results}
read -r -a MODES <<<"${MODES:-plain key tls tls-psk tls+key}"
NAME=${NAME:-security}
PAR=${PAR:-1}
SCRIPT=bench-security
# shellcheck source=lib/bench-procs.sh
. "$(dirname "$0")/lib/bench-procs.sh"

[ -x "$BIN" ] || { echo "bench-security: $BIN missing (cargo build --release -p farcache-cli)" >&2; exit 1; }
mkdir -p "$work/backing" "$OUT"
head -c 128M /dev/urandom >"$work/backing/f"
"$BIN" certs --out "$work/pki" --client default >/dev/null
"$BIN" keygen --out "$work/block.key" >/dev/null
"$BIN" keygen --out "$work/psk.key" >/dev/null

pki="$work/pki"
for mode in "${MODES[@]}"; do
  tag=${mode//+/-}
  tls=""; mount_args=()
  case $mode in
    tls|tls+key)
      tls="tls_cert = \"$pki/server.pem\"
tls_key = \"$pki/server.key\"
tls_client_ca = \"$pki/ca.pem\""
      mount_args+=(--tls-ca "$pki/ca.pem" --tls-cert "$pki/client-default.pem" --tls-key "$pki/client-default.key") ;;
    tls-psk)
      tls="tls_psk_file = \"$work/psk.key\""
      mount_args+=(--tls-psk-file "$work/psk.key") ;;
  esac
  case $mode in *key) mount_args+=(--key-file "$work/block.key") ;; esac
  case $mode in
    mc|mc+key)
      [ "$mode" = mc ] && mount_args+=(--memcached-plaintext)
      port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
      user=(); [ "$(id -u)" = 0 ] && user=(-u nobody)
      memcached -l 127.0.0.1 -p "$port" -U 0 -m 512 "${user[@]}" 2>"$work/server-$tag.log" &
      pids+=($!)
      for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
      addr="memcached://127.0.0.1:$port" ;;
    *)
      printf '[server]\nlisten = "127.0.0.1:0"\ncapacity = "256MiB"\nslot_bytes = 4160\n%s\n' "$tls" >"$work/server-$tag.toml"
      "$BIN" server --config "$work/server-$tag.toml" >"$work/server-$tag.out" 2>"$work/server-$tag.log" &
      pids+=($!)
      wait_for "$work/server-$tag.out" "listening on" "$!"
      addr=$(sed -n 's/.*listening on //p' "$work/server-$tag.out") ;;
  esac
  mkdir -p "$work/mnt-$tag"
  # Threshold routing: every small read asks the lender (the fast disk here would otherwise
  # rightly keep the reads), which is what this benchmark measures.
  "$BIN" mount "$work/backing" "$work/mnt-$tag" --server "$addr" --routing threshold "${mount_args[@]}" \
    >"$work/mount-$tag.out" 2>"$work/mount-$tag.log" &
  pids+=($!)
  wait_for "$work/mount-$tag.out" "farcache mounted" "$!"
done

hits() { "$BIN" stats "$work/mnt-$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["remote"]["hits"])'; }
echo "bench-security: ${#MODES[@]} modes up; warming each lender with two passes of $READ"
for mode in "${MODES[@]}"; do
  tag=${mode//+/-}
  "$BIN" randread "$work/mnt-$tag/f" --size "$READ" --passes 2 >/dev/null
done

results="$work/results.tsv"
: >"$results"
for round in $(seq "$ROUNDS"); do
  n=${#MODES[@]}
  for i in $(seq 0 $((n - 1))); do
    mode=${MODES[$(( (i + round) % n ))]}
    tag=${mode//+/-}
    before=$(hits "$tag")
    line=$("$BIN" randread "$work/mnt-$tag/f" --size "$READ" --passes 1 --verify "$work/backing/f" | grep '^pass 1:')
    after=$(hits "$tag")
    # "pass 1: 1.23 s, 5678 reads/s, 22.2 MiB/s, latency p50 160 us, p99 900 us, ..."
    rps=$(sed -E 's/.*, ([0-9]+) reads\/s.*/\1/' <<<"$line")
    p50=$(sed -E 's/.*p50 ([0-9]+) us.*/\1/' <<<"$line")
    p99=$(sed -E 's/.*p99 ([0-9]+) us.*/\1/' <<<"$line")
    par_rps=0
    if [ "$PAR" -gt 1 ]; then
      # N readers at once, each its own random sequence: the lender's throughput.
      par_pids=()
      for j in $(seq "$PAR"); do
        "$BIN" randread "$work/mnt-$tag/f" --size "$READ" --passes 1 --seed $((round * 100 + j)) \
          >"$work/par-$j.out" 2>&1 &
        par_pids+=($!)
      done
      wait "${par_pids[@]}"
      for j in $(seq "$PAR"); do
        r=$(grep '^pass 1:' "$work/par-$j.out" | sed -E 's/.*, ([0-9]+) reads\/s.*/\1/')
        par_rps=$((par_rps + r))
      done
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$mode" "$rps" "$p50" "$p99" "$((after - before))" "$par_rps" >>"$results"
  done
  echo "bench-security: round $round/$ROUNDS done"
done

python3 - "$results" "$OUT" "$READ" "$ROUNDS" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$NAME" "$PAR" "${MODES[*]}" <<'EOF'
import json, statistics, sys
path, out, read, rounds, cpus, load, name, par, modes = sys.argv[1:]
modes, par = modes.split(), int(par)
rows = [l.split("\t") for l in open(path).read().splitlines()]
names = {"plain": "farcache lender, plaintext", "key": "farcache lender, block encryption",
         "tls": "TLS (certificates)", "tls-psk": "TLS (pre-shared key)", "tls+key": "TLS + block encryption",
         "mc": "memcached lender, plaintext", "mc+key": "memcached lender, block encryption"}
res = {}
for m in modes:
    r = [x for x in rows if x[1] == m]
    res[m] = {"reads_per_s": [int(x[2]) for x in r], "p50_us": [int(x[3]) for x in r],
              "p99_us": [int(x[4]) for x in r], "lender_hits": [int(x[5]) for x in r],
              "parallel_reads_per_s": [int(x[6]) for x in r]}
base = statistics.median(res[modes[0]]["reads_per_s"])
head = "| mode | reads/s (median) | vs " + modes[0] + " | p50 (median) | p99 (median) | lender hits per pass (min) |"
rule = "|---|---:|---:|---:|---:|---:|"
if par > 1:
    pbase = statistics.median(res[modes[0]]["parallel_reads_per_s"])
    head += f" {par} readers: reads/s (median) | vs {modes[0]} |"
    rule += "---:|---:|"
lines = [f"Lender hits through the mount: 4 KiB O_DIRECT random reads, {read} per pass, {rounds} rounds in rotating order, "
         f"all modes up at once; {cpus} CPUs, load average at the end {load}.", "", head, rule]
for m in modes:
    r = res[m]
    med = statistics.median(r["reads_per_s"])
    r["median_reads_per_s"] = med
    r["vs_first"] = med / base
    row = (f"| {names[m]} | {med:,.0f} | {med / base:.2f} | {statistics.median(r['p50_us']):.0f} µs | "
           f"{statistics.median(r['p99_us']):.0f} µs | {min(r['lender_hits'])} |")
    if par > 1:
        pm = statistics.median(r["parallel_reads_per_s"])
        r["median_parallel_reads_per_s"] = pm
        row += f" {pm:,.0f} | {pm / pbase:.2f} |"
    lines.append(row)
if "tls+key" in res:
    target = res["tls+key"]["vs_first"]
    lines += ["", f"Target TLS + block encryption ≥ 0.85× plaintext: {target:.2f}× — {'met' if target >= 0.85 else 'NOT met'}."]
text = "\n".join(lines) + "\n"
print(text)
open(f"{out}/{name}.md", "w").write(text)
json.dump({"read": read, "rounds": int(rounds), "cpus": int(cpus), "load": load, "parallel_readers": par, "modes": res},
          open(f"{out}/{name}.json", "w"), indent=1)
EOF
