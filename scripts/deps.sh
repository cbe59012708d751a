#!/usr/bin/env bash
# Install what `make test` / `make bench` need and this machine lacks. Idempotent: it only
# calls apt-get when a command is missing, and says what it is doing.
set -euo pipefail

need_apt=()
command -v memcached >/dev/null 2>&1 || [ -x /usr/bin/memcached ] || need_apt+=(memcached)
# FUSE: fusermount3 mounts and unmounts for the unprivileged-style mount path fuser uses.
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)

if ! command -v cargo >/dev/null 2>&1; then
  echo "deps: cargo is missing. Install a Rust toolchain (rustup, stable >= 1.85) and retry." >&2
  exit 1
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "deps: need Debian packages ${need_apt[*]}; run as root or install them: apt-get install -y ${need_apt[*]}" >&2
    exit 1
  fi
  echo "deps: installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # The package starts a memcached service on port 11211; the benchmarks run their own.
  if command -v systemctl >/dev/null 2>&1; then systemctl disable --now memcached >/dev/null 2>&1 || true; fi
  pkill -x memcached 2>/dev/null || true
fi
echo "deps: ok ($(cargo --version))"
