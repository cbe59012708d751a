#!/usr/bin/env bash
# What `make bench` needs beyond `make test`: matplotlib for the paper reproduction's plots
# (scripts/bench-paper-plot.py). Idempotent; installs only what is missing, and says so.
set -euo pipefail

if ! command -v python3 >/dev/null 2>&1; then
  echo "bench-deps: python3 is missing (apt-get install -y python3 python3-pip); plots will be skipped" >&2
  exit 0
fi
if ! python3 -c 'import matplotlib' >/dev/null 2>&1; then
  echo "bench-deps: installing matplotlib with pip (for the paper plots)"
  python3 -m pip install --quiet matplotlib || {
    echo "bench-deps: pip could not install matplotlib; plots will be skipped" >&2
    exit 0
  }
fi
echo "bench-deps: ok (python3 $(python3 -c 'import matplotlib; print("with matplotlib", matplotlib.__version__)'))"
