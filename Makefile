# farcache: the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
BIN := target/release/farcache

.PHONY: run test test-long bench deps build fuzz lint clean

## make run: build, then random reads on an emulated slow disk, passthrough vs farcache (embedded lender), side by side.
run: deps build
	./scripts/run-demo.sh

## make test: every test (unit, property, real-process integration, malformed input, bench smoke).
test: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) build --locked --workspace --all-targets
	$(CARGO) test --locked --workspace -- --color never
	python3 -m unittest discover -s scripts/tests
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings

## make test-long: the long crash runs, beyond CI's short versions (root; about 30 min): 1,000 SIGKILLs
## of a mount with a write-back tier under fdatasync'ing writers, 1,000 rounds of the tier's emulated
## power cuts (random crash states), 500 kills and 100 upgrades of a supervised mount under load,
## 500 kills of a supervised mount of two backing directories under load.
test-long: deps
	FARCACHE_TIER_CRASH_CYCLES=1000 $(CARGO) test --locked -p farcache-cli --test tier_crash -- --color never acknowledged_writes_survive_sigkill --exact
	FARCACHE_CRASH_ROUNDS=1000 $(CARGO) test --locked -p farcache-tier --lib -- --color never crash::random_crash_states
	FARCACHE_TAKEOVER_KILLS=500 $(CARGO) test --locked -p farcache-cli --test takeover -- --color never reader_and_writer_verify_every_byte_across_kills_and_takeovers --exact
	FARCACHE_UNION_KILLS=500 $(CARGO) test --locked -p farcache-cli --test union_survival -- --color never a_supervised_union_keeps_every_byte_and_open_file_across_kills --exact

## make bench: the full benchmarks; results go to BENCHMARKS.md by hand, raw JSON to bench/results/.
## bench restart (root): the stall per upgrade and per crash of a supervised mount (about 4 min).
## The paper reproduction (root; about 2 h, tpch 70 of them) also writes bench/results/paper-cloud.{json,md} and plots.
## Nothing gets slower (root; about 2 h 30 min a pair of every job, measured in session 42: the seven short jobs 20 min, raw tpch 26, cloud tpch 48, hdd randread 42, 10 Gbit/s tpch 12; resumable per job; REPEAT=N for N pairs per job, N times as long; RETRY=N more pairs at most per job while fewer than REPEAT are undisturbed, default 1): issue 17's table, scripts/nothing-slower-table.py.
bench: deps build
	./scripts/bench-deps.sh
	mkdir -p bench/results
	$(BIN) bench server --json bench/results/server.json
	$(BIN) bench policy
	$(BIN) bench alloc --json bench/results/alloc.json
	$(BIN) bench alloc --throughput --json bench/results/alloc-throughput.json
	BIN=$(BIN) OUT=bench/results ./scripts/bench-security.sh
	BIN=$(BIN) OUT=bench/results MODES="plain key mc mc+key" NAME=memcached PAR=4 ./scripts/bench-security.sh
	BIN=$(BIN) OUT=bench/results ./scripts/bench-hit-path.sh
	BIN=$(BIN) OUT=bench/results ./scripts/bench-read-cost.sh
	BINS=$(BIN) OUT=bench/results ./scripts/bench-write-cost.sh
	BIN=$(BIN) OUT=bench/results ./scripts/bench-read-concurrency.sh
	BIN=$(BIN) OUT=bench/results ./scripts/bench-xattrs.sh
	BIN=$(BIN) ./scripts/bench-paper.sh
	BIN=$(BIN) ./scripts/bench-nothing-slower.sh
	BIN=$(BIN) ./scripts/bench-writeback.sh
	BIN=$(BIN) ./scripts/bench-engine.sh
	BIN=$(BIN) ./scripts/bench-migrate.sh
	BIN=$(BIN) ./scripts/bench-tenants.sh
	$(BIN) bench restart --json bench/results/restart.json

deps:
	@./scripts/deps.sh

build:
	$(CARGO) build --locked --release -p farcache-cli

## make fuzz: a bounded run of the decoder fuzz target (needs the nightly toolchain and cargo-fuzz).
fuzz:
	mkdir -p fuzz/corpus/decode && cd fuzz && $(CARGO) +nightly fuzz run decode corpus/decode seeds/decode -- -max_total_time=60 -rss_limit_mb=1024

lint:
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean
