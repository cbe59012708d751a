# Shared by the benchmark scripts that start daemons of their own (source it after setting
# SCRIPT, e.g. SCRIPT=bench-security): a work directory, the daemons' pids, a cleanup that stops
# them and unmounts whatever they left mounted under the work directory however the script
# ends, and a bounded wait for a daemon's readiness line.
work=$(mktemp -d "${TMPDIR:-/tmp}/farcache-$SCRIPT.XXXXXX")
pids=()
cleanup() {
  local p m
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for m in "$work"/mnt-*; do
    if grep -qs " $m " /proc/self/mountinfo; then fusermount3 -u -z "$m" 2>/dev/null || true; fi
  done
  if grep -qs " $work/backing " /proc/self/mountinfo; then umount "$work/backing" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Wait for `pattern` in `file`, at most `tenths` tenths of a second (default 200: 20 s), while
# `pid` lives (its log is FILE minus .out plus .log).
wait_for() {
  local file=$1 pattern=$2 pid=$3 tenths=${4:-200}
  for _ in $(seq "$tenths"); do
    grep -q "$pattern" "$file" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || { echo "$SCRIPT: process exited early:" >&2; cat "${file%.out}.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "$SCRIPT: no '$pattern' in $file after $((tenths / 10)) s" >&2
  exit 1
}

# A 64 MiB file of random bytes on a tmpfs backing ($work/backing/f; the cleanup unmounts it)
# and a 256 MiB lender on loopback, its address in $addr: what the tmpfs benchmarks
# (bench-hit-path, bench-read-cost) measure against. Needs root and $BIN.
tmpfs_file_and_lender() {
  mkdir -p "$work/backing"
  mount -t tmpfs -o size=96M tmpfs "$work/backing"
  head -c 64M /dev/urandom >"$work/backing/f"
  printf '[server]\nlisten = "127.0.0.1:0"\ncapacity = "256MiB"\n' >"$work/server.toml"
  "$BIN" server --config "$work/server.toml" >"$work/server.out" 2>"$work/server.log" &
  pids+=($!)
  wait_for "$work/server.out" "listening on" "$!"
  addr=$(sed -n 's/.*listening on //p' "$work/server.out")
}
