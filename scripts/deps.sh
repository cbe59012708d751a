#!/usr/bin/env bash
# Install what `make test` / `make bench` need and this machine lacks. Idempotent: it only
# calls apt-get when a command is missing, and says what it is doing.
set -euo pipefail

need_apt=()
command -v memcached >/dev/null 2>&1 || [ -x /usr/bin/memcached ] || need_apt+=(memcached)
# FUSE: fusermount3 mounts and unmounts for the unprivileged-style mount path fuser uses.
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
# systemd-analyze: crates/cli/tests/systemd.rs verifies etc/systemd's units with it (offline;
# it needs no systemd running as PID 1).
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
# fio and postmark: `bench paper`'s paper 003 experiments (dfsio, postmark), whose quick
# version runs in crates/cli/tests/bench_paper.rs.
command -v fio >/dev/null 2>&1 || need_apt+=(fio)
command -v postmark >/dev/null 2>&1 || need_apt+=(postmark)
# PostgreSQL 15 for crates/cli/tests/postgres.rs. On Debian 12 postgresql-15 holds initdb,
# pg_ctl, pgbench, pg_checksums and the contrib modules (amcheck); psql comes with its
# dependency postgresql-client-15. There is no separate postgresql-contrib-15.
PG_BIN=/usr/lib/postgresql/15/bin
need_pg=0
for f in initdb pg_ctl postgres pgbench pg_checksums psql; do
  [ -x "$PG_BIN/$f" ] || need_pg=1
done
[ -f /usr/share/postgresql/15/extension/amcheck.control ] || need_pg=1
[ "$need_pg" = 0 ] || need_apt+=(postgresql-15 postgresql-client-15)

if ! command -v cargo >/dev/null 2>&1; then
  echo "deps: cargo is missing. Install a Rust toolchain (rustup, stable >= 1.85) and retry." >&2
  exit 1
fi

# Undone on exit, also when apt-get fails: the temporary files that keep the PostgreSQL
# package from creating and starting a cluster of its own.
cleanup=()
undo() {
  local f
  for f in "${cleanup[@]+"${cleanup[@]}"}"; do rm -f "$f"; done
}
trap undo EXIT

if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "deps: need Debian packages ${need_apt[*]}; run as root or install them: apt-get install -y ${need_apt[*]}" >&2
    exit 1
  fi
  if [ "$need_pg" = 1 ]; then
    # The tests run their own PostgreSQL on a port of their own. The package would create a
    # cluster "main" on port 5432 and start it: a drop-in tells pg_createcluster not to create
    # it, and policy-rc.d (exit 101: "action forbidden") keeps invoke-rc.d from starting any
    # service during the install. A policy-rc.d that was already there (containers ship one)
    # is left alone.
    mkdir -p /etc/postgresql-common/createcluster.d
    dropin=/etc/postgresql-common/createcluster.d/zz-farcache-deps-no-main.conf
    printf 'create_main_cluster = false\n' >"$dropin"
    cleanup+=("$dropin")
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\n# Temporary, from farcache scripts/deps.sh: no service starts during the install.\nexit 101\n' \
        >/usr/sbin/policy-rc.d
      chmod 755 /usr/sbin/policy-rc.d
      cleanup+=(/usr/sbin/policy-rc.d)
    fi
  fi
  echo "deps: installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  undo
  cleanup=()
  # The package starts a memcached service on port 11211; the benchmarks run their own.
  if command -v systemctl >/dev/null 2>&1; then systemctl disable --now memcached >/dev/null 2>&1 || true; fi
  pkill -x memcached 2>/dev/null || true
  if [ "$need_pg" = 1 ]; then
    # Nothing of the package's may listen on 5432: stop any cluster that was created and
    # started anyway (an older postgresql-common, a systemd machine), and keep it from boot.
    if command -v systemctl >/dev/null 2>&1; then systemctl disable --now postgresql >/dev/null 2>&1 || true; fi
    if command -v pg_lsclusters >/dev/null 2>&1; then
      pg_lsclusters --no-header 2>/dev/null | while read -r ver name port status _; do
        if [ "${status%%,*}" = online ]; then
          echo "deps: stopping PostgreSQL cluster $ver/$name (port $port) started by the package"
          pg_ctlcluster "$ver" "$name" stop || true
        fi
      done
    fi
  fi
fi
for f in initdb pg_ctl postgres pgbench pg_checksums psql; do
  if [ ! -x "$PG_BIN/$f" ]; then
    echo "deps: $PG_BIN/$f is still missing after installing postgresql-15" >&2
    exit 1
  fi
done
if ! id postgres >/dev/null 2>&1; then
  echo "deps: the 'postgres' user is missing (postgresql-common creates it); the PostgreSQL test runs as it" >&2
  exit 1
fi
# go-tpc (the Go module proxy): the TPC-C-like load of `bench paper --experiment oltp`, whose
# quick version crates/cli/tests/bench_paper.rs runs as root. Built from source with the Go
# toolchain into /usr/local/bin (GOBIN); without root that test needs nothing, so a missing Go
# is an error only as root.
GO_TPC_VERSION=v1.0.12
if ! command -v go-tpc >/dev/null 2>&1 && [ ! -x /usr/local/bin/go-tpc ]; then
  go=$(command -v go 2>/dev/null || true)
  if [ -z "$go" ] && [ -x /usr/local/go/bin/go ]; then go=/usr/local/go/bin/go; fi
  if [ -z "$go" ]; then
    if [ "$(id -u)" = 0 ]; then
      echo "deps: go-tpc is missing and so is Go (no go on PATH nor /usr/local/go/bin/go): install a Go toolchain (>= 1.21), then run make deps again" >&2
      exit 1
    fi
    echo "deps: note: no Go toolchain, so no go-tpc: bench paper --experiment oltp cannot run (the root-only test is skipped without root)" >&2
  elif [ "$(id -u)" != 0 ]; then
    echo "deps: note: go-tpc is missing; as root: GOBIN=/usr/local/bin $go install github.com/pingcap/go-tpc/cmd/go-tpc@$GO_TPC_VERSION" >&2
  else
    echo "deps: installing go-tpc $GO_TPC_VERSION with $go install (GOBIN=/usr/local/bin)"
    GOBIN=/usr/local/bin timeout 900 "$go" install "github.com/pingcap/go-tpc/cmd/go-tpc@$GO_TPC_VERSION" || {
      echo "deps: go install of go-tpc failed; bench paper --experiment oltp cannot run" >&2
      exit 1
    }
  fi
fi
# tpchgen-cli (PyPI): TPC-H data for the quick paper bench's tpch experiment, which
# crates/cli/tests/bench_paper.rs runs as root (without root that test needs nothing).
"$(dirname "$0")/bench-deps.sh" tpchgen || [ "$(id -u)" != 0 ]
echo "deps: ok ($(cargo --version))"
