# Every target creates .venv on first use and installs the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint chaos bench bench-webhook bench-chat bench-loop-lag bench-memory bench-tools bench-cron \
	bench-sandbox bench-profile bench-replicas bench-overload soak mutate clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/hermes-gateway demo

# Tests run in one worker process per core (pytest-xdist), a test file per worker at a time.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n auto --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check .

# The long SIGKILL chaos test (tests/chaos; `make test` runs it with 20 kills): the gateway is killed 200 times
# under traffic on every platform; prints its figures and seed (replay with --chaos-seed). 10-15 minutes.
chaos: $(STAMP)
	$(BIN)/python -m pytest tests/chaos --chaos-kills 200

# Benchmarks (bench/RESULTS.md): each prints a table and writes bench/results/<name>.json. `make bench`
# runs all of them (not the soak) at sizes that finish in about five minutes on a 2-core machine.
BENCH := $(BIN)/python -m bench

bench: bench-webhook bench-chat bench-loop-lag bench-memory bench-tools bench-cron bench-sandbox

bench-webhook: $(STAMP)
	$(BENCH).bench_webhook --rounds 3 --duration 6 --open-duration 3

bench-chat: $(STAMP)
	$(BENCH).bench_chat --platform telegram slack discord --users 50 --messages 5 --inflight-users 1000

bench-loop-lag: $(STAMP)
	$(BENCH).bench_loop_lag

bench-memory: $(STAMP)
	$(BENCH).bench_memory --sessions 500 --messages 3000 --users 500 --rate 35

bench-tools: $(STAMP)
	$(BENCH).bench_tools

bench-cron: $(STAMP)
	$(BENCH).bench_cron

# The tool sandbox against in-process tools: round trip of a call, and main-loop lag in CPU-bound and regex storms.
bench-sandbox: $(STAMP)
	$(BENCH).bench_sandbox

# 1, 2 and 3 replicas on one PostgreSQL database (started by .ci/start-postgres unless HERMES_TEST_PG_URL is set).
bench-replicas: $(STAMP)
	HERMES_TEST_PG_URL="$${HERMES_TEST_PG_URL:-$$(.ci/start-postgres)}" $(BENCH).bench_replicas

# Overload and agent workers (issue #28): worker processes against in-process loops, 1,000 webhooks at once, chat in
# a webhook storm, the tool storms (~12 minutes); then adaptive admission against fixed limits in a 60 s burst at
# twice the maximum (~14 minutes). Both write bench/results/overload.json.
bench-overload: $(STAMP)
	$(BENCH).bench_overload --scenarios throughput,at-once,chat,storms
	$(BENCH).bench_overload --scenarios burst

# pyinstrument profile of the gateway under the webhook load: bench/results/webhook_profile.html
bench-profile: $(STAMP)
	$(BENCH).bench_webhook --profile

# The long memory soak: 50,000 Telegram messages over 5,000 sessions at 35/s plus 2 webhooks/s, RSS and the
# database's size over time (bench/results/soak.json), with a short retention (events, transcripts and sent parts
# 2 minutes, dedupe records 10 minutes, pruned every 30 s) so the size is flat once the dedupe window has passed.
# About 25 minutes.
soak: $(STAMP)
	$(BENCH).bench_memory --sessions 0 --messages 50000 --users 5000 --rate 35 --webhook-rate 2 \
		--retention 120 --dedupe 600 --prune-interval 30 --name soak

# Mutation testing (bench/mutation_report.py): mutmut over the modules that carry guarantees, each judged by its
# own tests (PostgreSQL started as for bench-replicas); the kill rate per module and every mutant not killed go to
# bench/results/mutation.json and a section of bench/RESULTS.md. About an hour; not part of `make test`.
mutate: $(STAMP)
	HERMES_TEST_PG_URL="$${HERMES_TEST_PG_URL:-$$(.ci/start-postgres)}" $(BIN)/python -m bench.mutation_report

clean:
	rm -rf $(VENV) .venv-mutate mutants .pytest_cache .ruff_cache .hypothesis
