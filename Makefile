# gpusched: `make run` starts everything, `make test` runs every test.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint bench bench-fanout clean-db

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) manage.py run_all

test: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) benchmarks/run.py
	$(PY) benchmarks/websocket_fanout.py

bench-fanout: $(STAMP)
	$(PY) benchmarks/websocket_fanout.py

# Stops the embedded PostgreSQL and deletes its data under ./var/.
clean-db: $(STAMP)
	$(PY) manage.py embedded_db stop || true
	rm -rf var/pgdata
