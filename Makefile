# seckill — developer entry points. Every recipe line runs with scripts/env.sh sourced, so the
# local defaults (DATABASE_URL, REDIS_URL, ORDER_QUEUE_URL, AWS_* for the SQS emulator, ...) apply
# unless your environment already sets them.
#
#   make stack        start whatever of the local stack is missing (idempotent)
#   make test         fmt check, clippy -D warnings, cargo doc -D warnings, template checks, the arm64 build's tools (cfn-lint, sam validate,
#                     scripts/check-template.py and its --self-test), the workspace tests (incl. cargo-lambda invoke;
#                     every Redis test on a standalone Redis, the cluster and Valkey), then
#                     schemathesis against a dev server (scripts/schemathesis.sh), then the pages
#                     in headless Chromium (scripts/browser-tests.sh), then the README's commands
#                     (scripts/readme-check.py)
#   make test-valkey  only the Valkey variants of the Redis tests (127.0.0.1:6380)
#   make serve        the HTTP API on 127.0.0.1:3000 + queue poller + schedules, in one process (PROFILE=dev: debug),
#                     its queue on fauxqs (127.0.0.1:4567); make serve SQS=moto serves on moto
#   make wrk-check    load test: dev server on fauxqs, wrk 10 s x 256 connections on the accepted
#                     purchase path; fails on any timeout, socket error, 5xx or lost order
#   make draw-check   a draw at real size: 120,000 entrants through wrk on the dev server, the draw
#                     triggered by a status read; fails if a PING waited > 25 ms or a winner has no order
#   make demo         a live flash sale on the local stack (PROFILE=local by default; release, dev); options: DEMO_ARGS="--buckets 3 --cluster"
#                     (stock in 3 buckets, on the 3-node Redis Cluster), DEMO_ARGS="--admission draw"
#                     (the opening decided by a draw; DEMO_ARGS=--help lists all)
#   make token        a dev JWT: make token USER=bob [ADMIN=1]   (default user: alice; scope seckill:user,
#                     with ADMIN=1 seckill:user seckill:admin, as the user pool issues; SCOPE='...' sets the
#                     claim exactly: make token SCOPE= mints one without any, to see the user routes' 403)
#   make openapi      regenerate docs/openapi.json from the handlers (a test fails when it is stale)
#   make readme-check every command of README.md, run or accounted for
#   make test-browser the storefront and operator pages in headless Chromium (Playwright, pytest)
#                     against a throwaway dev server; screenshots in target/browser/
#   make bench        the benchmark (BENCH_ARGS=--quick for a ~30 s smoke run); writes bench/RESULTS.md
#   make chaos        the seeded chaos test over many seeds (defaults SEEDS=1..1000 MINUTES=10)
#                     (no new seed starts after MINUTES; CHAOS_SECONDS=6 is each seed's phase)
#   make tools-lambda cargo-lambda + aws-sam-cli into .tools/venv (make stack does it too)
#   make build        Lambda bootstrap binaries, arm64 only (cargo lambda; scripts/check-build-tools.sh first)
#   make clean-stack  stop the cluster nodes, Valkey, moto_server and fauxqs that `make stack` started
#   make sqlx-prepare after changing a query: regenerate .sqlx/ (the offline query data every
#                     build uses) against a freshly migrated scratch database; commit .sqlx/

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ENV := source scripts/env.sh &&
VENV := .tools/venv
# The Lambda functions (template.yaml's Binary values), built by `make build`.
LAMBDA_BINS := seckill-entry order-consumer preheat reconcile admin seckill-migrate
# sam validate works offline; it only needs a region.
SAM := AWS_DEFAULT_REGION=us-east-1 SAM_CLI_TELEMETRY=0 $(VENV)/bin/sam

# `make token USER=bob`: a command-line USER wins; the USER that make imports from the login
# environment (root, ...) does not, so the default stays alice. USER_ID=bob works as well.
ifeq ($(origin USER),command line)
USER_ID ?= $(USER)
endif
USER_ID ?= alice
ADMIN ?=
DEMO_ARGS ?=
BENCH_ARGS ?=
# `make chaos`: the seeds (`1,5,9`, `1..200` with 200 excluded, `1..=200`) and the time bound.
SEEDS ?= 1..1000
MINUTES ?= 10

# `make sqlx-prepare`: where sqlx-cli is installed (git-ignored) and the scratch database's name.
SQLX_CLI_ROOT ?= .tools/sqlx-cli
SQLX_SCRATCH_DB ?= seckill_sqlx_prepare

.PHONY: help readme-check test-browser wrk-check draw-check stack test test-valkey valkey-check fmt clippy lint-template demo serve token openapi build tools-lambda bench chaos clean-stack stack-status sqlx-cli sqlx-prepare

help:
	@sed -n 's/^#   make /make /p' $(firstword $(MAKEFILE_LIST))

stack:
	bash scripts/stack.sh

stack-status:
	bash scripts/stack.sh status

test: stack
	bash scripts/drop-test-dbs.sh
	$(ENV) cargo fmt --all -- --check
	$(ENV) cargo clippy --workspace --all-targets -- -D warnings
	$(ENV) RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps # a broken doc link fails
	$(ENV) cargo deny check licenses bans sources # deny.toml
	$(ENV) $(VENV)/bin/cfn-lint template.yaml
	$(ENV) $(SAM) validate --lint
	$(ENV) $(VENV)/bin/python scripts/check-template.py
	$(ENV) $(VENV)/bin/python scripts/check-template.py --self-test # each check fails on a template that breaks it
	$(ENV) bash scripts/check-build-tools.sh # what the arm64 deploy build needs, without building
	$(ENV) cargo build $(addprefix --bin ,$(LAMBDA_BINS)) # the binaries tests/tests/lambda_invoke.rs runs
	$(MAKE) --no-print-directory valkey-check
	$(ENV) cargo nextest run --workspace # on_every_redis! tests included: Redis, the cluster, Valkey
	bash scripts/schemathesis.sh # fuzzes a dev server with docs/openapi.json, a user and an admin token
	bash scripts/browser-tests.sh # the storefront and operator pages in headless Chromium
	$(MAKE) --no-print-directory readme-check

# Every command of README.md, run (fast: the debug build, a small crowd) or accounted for.
readme-check: stack
	$(ENV) $(VENV)/bin/python scripts/readme-check.py

# ElastiCache's default engine is Valkey: every test of on_every_redis! has a `::valkey`
# variant, run on VALKEY_URL by `make test`'s one nextest run, after checking that the server
# there is Valkey. `make test-valkey` runs those variants alone.
test-valkey: stack valkey-check
	# --workspace, as `make test` built it: `-p seckill-tests` alone unifies other features of
	# seckill-shared and rebuilds every workspace crate (minutes on two cores).
	$(ENV) cargo nextest run --workspace -E 'package(seckill-tests) and test(/::valkey$$/)'

valkey-check:
	$(ENV) redis-cli -u "$$VALKEY_URL" info server | tr -d '\r' | grep '^valkey_version:' \
		|| { echo "no Valkey server at $$VALKEY_URL (bash scripts/stack.sh starts one)" >&2; exit 1; }

fmt:
	cargo fmt --all

clippy:
	$(ENV) cargo clippy --workspace --all-targets -- -D warnings

lint-template: stack
	$(ENV) $(VENV)/bin/cfn-lint template.yaml
	$(ENV) $(SAM) validate --lint
	$(ENV) $(VENV)/bin/python scripts/check-template.py
	$(ENV) $(VENV)/bin/python scripts/check-template.py --self-test # each check fails on a template that breaks it

# `make serve`, `make demo` and `make wrk-check` put their queue on fauxqs (127.0.0.1:4567, started
# by `stack.sh serve`), not moto: under a load tool's hundreds of concurrent senders moto pins a
# core and stops answering. The URL is the one fauxqs's CreateQueue returns (its account
# 000000000000; the host part is a label, the SDK sends to the endpoint). These win over env.sh's
# moto defaults; `make test` stays on moto, and so does `make serve SQS=moto`.
FAUXQS_SQS := AWS_ENDPOINT_URL_SQS=http://127.0.0.1:4567 \
	ORDER_QUEUE_URL=http://sqs.us-east-1.localhost:4567/000000000000/seckill-orders \
	ENTRY_QUEUE_URL=http://sqs.us-east-1.localhost:4567/000000000000/seckill-orders-entries \
	ORDER_DLQ_URL=http://sqs.us-east-1.localhost:4567/000000000000/seckill-orders-dlq
# `make serve SQS=moto`: env.sh's moto defaults (127.0.0.1:4566) instead.
SQS ?= fauxqs
ifeq ($(SQS),moto)
SERVE_STACK := up
SERVE_SQS :=
else ifeq ($(SQS),fauxqs)
SERVE_STACK := serve
SERVE_SQS := $(FAUXQS_SQS)
else
$(error SQS must be fauxqs (default) or moto, not '$(SQS)')
endif

# `make serve`, `make demo` and `make token` run binaries of ONE build: the dev server, the demo
# and the token minter, built by one cargo command, so their features unify once and the second
# target builds nothing. PROFILE picks its cargo profile: `local` (the default; optimised for a
# first build on two cores, see Cargo.toml), `release` (the Lambdas' own: fat LTO, one codegen
# unit; minutes longer to build), `dev` (the debug build `make test` made; readme-check uses it).
PROFILE ?= local
PROFILE_DIR := $(if $(filter dev,$(PROFILE)),debug,$(PROFILE))
APP_BINS := target/$(PROFILE_DIR)
APP_BUILD := cargo build --profile $(PROFILE) -p seckill-devserver -p seckill-loadgen \
	--bin seckill-devserver --bin seckill-demo --bin seckill-token
# `make demo DEMO_ARGS=--cluster` (or `--buckets 3 --cluster`): the stack starts the cluster too.
SERVE_CLUSTER := $(if $(findstring --cluster,$(DEMO_ARGS)),--cluster)

demo:
	bash scripts/stack.sh serve $(SERVE_CLUSTER)
	$(ENV) $(APP_BUILD)
	export $(FAUXQS_SQS) && $(ENV) $(APP_BINS)/seckill-demo $(DEMO_ARGS)

# A load tool's connections are descriptors: the soft limit is lifted to the hard one first.
serve:
	bash scripts/stack.sh $(SERVE_STACK)
	$(ENV) $(APP_BUILD)
	ulimit -n "$$(ulimit -Hn)" 2>/dev/null || true; \
		$(if $(SERVE_SQS),export $(SERVE_SQS) &&) $(ENV) $(APP_BINS)/seckill-devserver

# scripts/wrk-check.sh starts the stack (with fauxqs) and installs wrk itself.
wrk-check:
	bash scripts/wrk-check.sh

# scripts/draw-check.sh starts what it needs as wrk-check does.
draw-check:
	bash scripts/draw-check.sh

# scripts/browser-tests.sh installs chromium (apt) and playwright (venv) itself; PYTEST_ARGS
# narrows the run (PYTEST_ARGS="-k draw").
PYTEST_ARGS ?=
test-browser:
	bash scripts/browser-tests.sh $(PYTEST_ARGS)

token:
	$(ENV) $(APP_BUILD) -q
	$(ENV) $(APP_BINS)/seckill-token --user $(USER_ID) $(if $(ADMIN),--admin) \
		$(if $(filter command line,$(origin SCOPE)),--scope '$(SCOPE)')

openapi:
	$(ENV) cargo run -q -p seckill-devserver --bin seckill-openapi -- docs/openapi.json

tools-lambda:
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	test -x $(VENV)/bin/cargo-lambda -a -x $(VENV)/bin/sam || \
		$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'cargo-lambda>=1.8,<2' 'aws-sam-cli>=1.140,<2'

# arm64 only, as template.yaml deploys (Architectures: [arm64]): an x86_64 bootstrap in an arm64
# function fails every invocation with "exec format error", so there is no fallback.
# scripts/check-build-tools.sh first names what is missing (cargo-lambda: make tools-lambda; the
# aarch64 std: rustup target add aarch64-unknown-linux-gnu; zig from the venv's cargo-lambda wheel).
# cargo-lambda finds zig as `python3 -m ziglang`: the venv's python must come first on PATH, hence
# `activate` (env.sh appends the venv, so the system python3 would win).
build:
	bash scripts/check-build-tools.sh
	$(ENV) source $(VENV)/bin/activate && cargo lambda build --release --arm64 $(addprefix --bin ,$(LAMBDA_BINS)) \
		|| { echo "make build: the arm64 build failed (no x86_64 fallback: template.yaml deploys arm64)" >&2; exit 1; }

# The Lambda binaries are built first so the bench can report their size and time to ready.
bench: stack
	$(ENV) cargo build --release -p seckill-entry -p order-consumer -p preheat -p reconcile -p admin && cargo run --release -p seckill-bench -- $(BENCH_ARGS)

# tests/tests/chaos/ with many seeds. Its four tests (standalone / cluster, reconcile off / on)
# run side by side under the `chaos` nextest profile; each starts no new seed after MINUTES and
# ends with a line `chaos: N seeds passed in T s`. A failure names its seed: replay it with
# CHAOS_SEEDS=<seed> cargo nextest run -p seckill-tests --test chaos
chaos: stack
	$(ENV) CHAOS_SEEDS='$(SEEDS)' CHAOS_MINUTES='$(MINUTES)' cargo nextest run -p seckill-tests --test chaos --profile chaos

clean-stack:
	bash scripts/stack.sh stop

# sqlx-cli matching the sqlx in Cargo.toml (0.9), installed once into $(SQLX_CLI_ROOT).
sqlx-cli:
	test -x $(SQLX_CLI_ROOT)/bin/cargo-sqlx || cargo install sqlx-cli --version '^0.9' \
		--no-default-features --features postgres,rustls --locked --root $(SQLX_CLI_ROOT)

# Drops and recreates the scratch database on the server of DATABASE_URL, applies migrations/,
# then lets `cargo sqlx prepare` compile every target online against it and write .sqlx/.
sqlx-prepare: stack sqlx-cli
	$(ENV) export PATH="$(abspath $(SQLX_CLI_ROOT))/bin:$$PATH" \
		&& url="$${DATABASE_URL%/*}/$(SQLX_SCRATCH_DB)" \
		&& sqlx database drop -y --database-url "$$url" \
		&& sqlx database create --database-url "$$url" \
		&& sqlx migrate run --source migrations --database-url "$$url" \
		&& DATABASE_URL="$$url" SQLX_OFFLINE=false \
			cargo sqlx prepare --workspace -- --workspace --all-targets --all-features
