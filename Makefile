# gpusched: `make run` starts everything, `make test` runs every test.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint docs smoke-deploy bench bench-fanout fuzz fuzz-why load bench-queue-health bench-frontdoor bench-job-list bench-gpus bench-parallel bench-waiting-streams bench-frontdoor-bodies bench-wait-bound bench-llama-swap-state bench-resident-sets-wait simulate-report bench-resident-sets bench-estimates bench-why clean-db

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) manage.py run_all

# Every test, on every core (pytest-xdist: two workers per core, as an
# end-to-end test spends about half its time waiting on the processes it
# started; each worker has a test database of its own), in a new random
# order each run (pytest-randomly). The seed is printed first; TEST_SEED=N
# replays that order. Tests marked `serial` run after, alone (a second
# pytest call, made when a test has the mark); both parts run, whatever the
# first gave. TEST_ONLY=<mark expression> narrows the choice (.ci/run's
# DATABASE_URL variant: TEST_ONLY=database_server). docs/operations/tests.md.
TEST_WORKERS ?= $(shell echo $$((2 * $$(nproc))))
ifndef TEST_SEED
TEST_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
PYTEST := $(PY) -m pytest -p no:cacheprovider --randomly-seed=$(TEST_SEED)
TEST_CHOICE = $(if $(TEST_ONLY), and ($(TEST_ONLY)))

test: $(STAMP)
	@echo "== seed $(TEST_SEED): make test TEST_SEED=$(TEST_SEED) replays this order =="
	@status=0; \
	$(PYTEST) -n $(TEST_WORKERS) -m "not serial$(TEST_CHOICE)" || status=$$?; \
	if grep -rqs "mark.serial" tests; then \
		$(PYTEST) -m "serial$(TEST_CHOICE)" || { rc=$$?; \
			if [ $$rc -eq 5 ]; then echo "(no serial test in this choice)"; else status=$$rc; fi; }; \
	else echo "(no test is marked serial)"; fi; \
	exit $$status

# Everything but the end-to-end and browser tests (real processes): the
# quick check while working, under three minutes. A test that starts a
# process without the e2e mark fails (tests/conftest.py).
test-fast:
	@$(MAKE) --no-print-directory test TEST_ONLY="not e2e"

# The type check reads the settings but opens no database: any URL will do.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	DATABASE_URL=$${DATABASE_URL:-postgresql://localhost/unused} $(VENV)/bin/mypy
	# Every migration backward compatible with the previous release's running
	# processes, or accepted with its reason (sqlmigrate needs a database:
	# DATABASE_URL's, else the embedded one).
	$(PY) manage.py lint_migrations

# The documentation site from docs/ into site/, with mkdocs --strict: a broken
# link or a page missing from mkdocs.yml's nav fails. The HTTP API page is
# rendered from the OpenAPI schema first (no database opened: any URL will
# do). The docs extra is installed on first use; neither `make run` nor
# `make test` needs it.
docs:
	test -f $(STAMP) || $(MAKE) $(STAMP)
	$(PY) -c 'import mkdocs, material' 2>/dev/null || $(PY) -m pip install --quiet -e '.[docs]'
	DATABASE_URL=$${DATABASE_URL:-postgresql://localhost/unused} $(PY) manage.py api_reference
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(PY) benchmarks/run.py
	$(PY) benchmarks/websocket_fanout.py

bench-fanout: $(STAMP)
	$(PY) benchmarks/websocket_fanout.py

# The long variants of checks that `make test` runs small.
# Schemathesis against /api/schema/ and hypothesis against the OpenAI front
# door, with many examples (make test runs few).
fuzz: $(STAMP)
	GPUSCHED_FUZZ_EXAMPLES=$${GPUSCHED_FUZZ_EXAMPLES:-1000} $(PY) -m pytest -p no:cacheprovider \
		tests/security/test_schema_fuzz.py tests/security/test_frontdoor_fuzz.py

# `why` on 1,400 drawn days played through the claim (1-3 GPUs, slots,
# resident sets, cuts, cancels, expiries; about 10,000 jobs): every answer
# must add up. Writes how many it checked to var/why-days.json. About a
# quarter of an hour.
fuzz-why: $(STAMP)
	rm -f var/why-days.json
	GPUSCHED_FUZZ_EXAMPLES=$${GPUSCHED_FUZZ_EXAMPLES:-1400} GPUSCHED_WHY_DAYS_REPORT=var/why-days.json \
		$(PY) -m pytest -p no:cacheprovider tests/why/test_days_add_up.py
	cat var/why-days.json

# 2,000 submissions from 20 concurrent clients against a real web server.
load: $(STAMP)
	$(PY) benchmarks/load.py

# 8 simulated GPUs with a dispatcher each and 2 web servers, 10,000 jobs;
# the claim as GPUs are added; writes docs/benchmarks.md's several-GPUs
# section. About ten minutes.
bench-gpus: $(STAMP)
	$(PY) benchmarks/gpus.py

# Parallel slots: 4/16/64 concurrent openai chat callers through gpusched
# against the batching simulator called directly, an interactive image
# while chats stream, the policy simulator's chat-heavy trace; writes
# docs/benchmarks.md's parallel-slots section. About four minutes.
bench-parallel: $(STAMP)
	$(PY) benchmarks/parallel.py

# 1M finished and 100k queued jobs: the claim stays an index scan.
bench-queue-health: $(STAMP)
	$(PY) benchmarks/queue_health.py

# The OpenAI front door against calling the simulator directly and against a
# LiteLLM proxy in the same run (installed once into .venv-litellm/, a
# benchmark dependency only): added latency, 1,000 concurrent callers, a
# SIGKILL of the web server, the dispatch gap; writes docs/benchmarks.md's
# front-door section. A few minutes.
bench-frontdoor: $(STAMP)
	$(PY) benchmarks/frontdoor.py

# `GET /api/jobs/` against `GET /api/queue/` with 100 and 300 of a member's
# jobs queued; writes docs/benchmarks.md's job-list section. Under a minute.
bench-job-list: $(STAMP)
	$(PY) benchmarks/job_list.py

# Streaming calls waiting in the queue: time to the first comment line, the
# gaps between lines, the web process's CPU; writes docs/benchmarks.md's
# waiting-streams section. Under a minute.
bench-waiting-streams: $(STAMP)
	$(PY) benchmarks/waiting_streams.py

# 50 front-door calls of 5 MB (vision chats) waiting in the queue: the web
# process's RSS against the bodies held, the bytes that reach PostgreSQL,
# the same calls through a LiteLLM proxy when .venv-litellm/ exists; writes
# docs/benchmarks.md's large-bodies section. About two minutes.
bench-frontdoor-bodies: $(STAMP)
	$(PY) benchmarks/frontdoor_bodies.py

# Calls refused for their wait bound (503 gpu_busy) beside a 201 and the
# health check in the same run; writes docs/benchmarks.md's wait-bound
# section. Under a minute.
bench-wait-bound: $(STAMP)
	$(PY) benchmarks/wait_bound.py

# How soon an unload at llama-swap shows in GET /api/gpus/, events flowing and off.
bench-llama-swap-state: $(STAMP)
	$(PY) benchmarks/llama_swap_state.py

# A TTS or embedding job's wait beside a running chat, with resident sets,
# one model at a time, and llama-swap alone; writes docs/benchmarks.md.
bench-resident-sets-wait: $(STAMP)
	$(PY) benchmarks/resident_sets_wait.py

# gpusched with llama-swap's resident sets against one model at a time,
# llama-swap alone and round-robin, on the studio day with studio.yaml, 1 and
# 2 GPUs; writes docs/benchmarks.md's resident-sets goals. A few seconds.
bench-resident-sets: $(STAMP)
	$(PY) benchmarks/resident_sets.py

# The size-aware estimate against the per-model mean on the sized traces:
# ETA error, wait-bound refusals, shorter first (docs/benchmarks.md,
# "Estimates from the request's size: the goals"). A few seconds.
bench-estimates: $(STAMP)
	$(PY) manage.py simulate fixtures/traces/studio-day-sized.jsonl --estimates
	$(PY) manage.py simulate fixtures/traces/studio-day-sized.jsonl --estimates \
		--max-wait 60 --bounded-share 0.3 --shortest-first-weights 0
	$(PY) manage.py simulate fixtures/traces/studio-day-sized.jsonl --estimates \
		--max-wait 600 --bounded-share 0.3 --shortest-first-weights 0
	$(PY) manage.py simulate fixtures/traces/studio-day-sized.jsonl --estimates \
		--max-wait 120 --bounded-share 1 --shortest-first-weights 0
	$(PY) manage.py simulate fixtures/traces/flood-sized.jsonl --gpus 4 --estimates
	$(PY) manage.py simulate fixtures/traces/flood.jsonl --gpus 4 --estimates

# `why` for a job that waited behind 500 decisions on two GPUs (chat in
# parallel slots), this code beside the code before the wait was cut once
# (9ed4e8f, extracted with `git archive`) on one database in the same run;
# writes docs/benchmarks.md's why section. About two minutes.
bench-why: $(STAMP)
	$(PY) benchmarks/why.py

# Every policy on every trace in fixtures/traces/; writes docs/benchmarks.md's
# policy section and its plots.
simulate-report: $(STAMP)
	$(PY) benchmarks/policy_report.py --llama-swap-config fixtures/llama-swap/studio.yaml

# Stops the embedded PostgreSQL and deletes its data under ./var/.
clean-db: $(STAMP)
	$(PY) manage.py embedded_db stop || true
	rm -rf var/pgdata

# The deployment guide (docs/operations/deployment.md) end to end: the wheel
# in a new venv, production mode against the PostgreSQL server on
# 127.0.0.1:5432 and Redis, the units' own commands, nginx over HTTPS; all
# of it removed at the end. Needs nginx, openssl and systemd-analyze; the
# `build` package is installed into .venv on first use.
smoke-deploy: $(STAMP)
	$(PY) -c 'import build' 2>/dev/null || $(PY) -m pip install --quiet build
	$(PY) deploy/smoke_deploy.py
