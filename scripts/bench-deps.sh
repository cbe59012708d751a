#!/usr/bin/env bash
# What `make bench` needs beyond `make test`: matplotlib for the paper reproduction's plots
# (scripts/bench-paper-plot.py), tpchgen-cli (PyPI) for its tpch experiment's data, and
# valgrind for the instruction counts of scripts/bench-read-cost.sh.
# Idempotent; installs only what is missing, and says so.
#   scripts/bench-deps.sh           both
#   scripts/bench-deps.sh tpchgen   tpchgen-cli only (scripts/deps.sh: `make test` runs the
#                                   quick paper bench, tpch included)
set -euo pipefail

only=${1:-}

python_with_pip() {
  if command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "bench-deps: python3 with pip is missing (apt-get install -y python3 python3-pip)" >&2
    return 1
  fi
  echo "bench-deps: installing Debian packages python3 python3-pip"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-pip >/dev/null
}

# pip install PACKAGE; on a Debian Python that refuses (externally managed), as root, into
# /usr/local with --break-system-packages (nothing of Debian's is replaced: pip installs the
# package and its own dependencies only).
pip_install() {
  python3 -m pip install --quiet "$1" 2>/dev/null && return 0
  python3 -m pip install --quiet --break-system-packages "$1"
}

# tpchgen-cli on PATH or in Python's scripts directory (where the harness looks too).
tpchgen_path() {
  command -v tpchgen-cli 2>/dev/null && return 0
  local d
  d=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null) || return 1
  [ -x "$d/tpchgen-cli" ] && echo "$d/tpchgen-cli"
}

tpchgen=$(tpchgen_path || true)
if [ -z "$tpchgen" ]; then
  python_with_pip || exit 1
  echo "bench-deps: installing tpchgen-cli with pip (TPC-H data for bench paper --experiment tpch)"
  pip_install tpchgen-cli || {
    echo "bench-deps: pip could not install tpchgen-cli; bench paper's tpch experiment cannot run" >&2
    exit 1
  }
  tpchgen=$(tpchgen_path || true)
  if [ -z "$tpchgen" ]; then
    echo "bench-deps: tpchgen-cli installed but not found on PATH nor in Python's scripts directory" >&2
    exit 1
  fi
fi
echo "bench-deps: ok ($("$tpchgen" --version) at $tpchgen)"
[ "$only" = tpchgen ] && exit 0

if ! command -v callgrind_control >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bench-deps: installing the Debian package valgrind (scripts/bench-read-cost.sh)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends valgrind >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends valgrind >/dev/null; } ||
      echo "bench-deps: apt-get could not install valgrind; scripts/bench-read-cost.sh cannot run" >&2
  else
    echo "bench-deps: valgrind is missing (apt-get install -y valgrind, as root); scripts/bench-read-cost.sh cannot run" >&2
  fi
fi

if ! command -v python3 >/dev/null 2>&1; then
  echo "bench-deps: python3 is missing (apt-get install -y python3 python3-pip); plots will be skipped" >&2
  exit 0
fi
if ! python3 -c 'import matplotlib' >/dev/null 2>&1; then
  echo "bench-deps: installing matplotlib with pip (for the paper plots)"
  pip_install matplotlib || {
    echo "bench-deps: pip could not install matplotlib; plots will be skipped" >&2
    exit 0
  }
fi
echo "bench-deps: ok (python3 $(python3 -c 'import matplotlib; print("with matplotlib", matplotlib.__version__)'))"
