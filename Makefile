# The two commands of the README:
#   make demo   the demo on SQLite: webhook server + worker (creates .venv on first use)
#   make test   lint, type-check, checks, and the whole suite on SQLite and on PostgreSQL
#   make test-fast   the inner loop: the SQLite suite alone, stopping at the first failure
#
# Needs make and a Python >= 3.10 that can create virtual environments (Debian/Ubuntu:
# apt-get install make python3-venv). PYTHON chooses it: make test PYTHON=python3.12.
# make test also needs PostgreSQL (PG_URL), Chromium (CHROMIUM) for the browser tests and
# Prometheus (PROMETHEUS: Debian's prometheus package, with promtool) for the metrics tests.
PYTHON ?= python3
VENV ?= .venv
CHROMIUM ?= /usr/bin/chromium
export CHROMIUM
PROMETHEUS ?= /usr/bin/prometheus
PY := $(VENV)/bin/python
# One database name per checkout, so two checkouts on one machine never drop each other's
# test database (test_feishu_inbox_<hash>).
PG_URL ?= postgres://postgres@127.0.0.1:5432/feishu_inbox_$(shell pwd | cksum | cut -d' ' -f1)

.PHONY: demo docs bytecode test test-fast lint test-sqlite test-postgres test-postgres-outages test-all chromium prometheus clean

# The virtual environment, with the demo's extra only (`make demo`: a fraction of the
# development tools' size), or with everything the tests and the linters need (`.installed`).
$(VENV)/.created:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || { \
	  echo "make: '$(PYTHON)' is not Python >= 3.10; choose one: make $(MAKECMDGOALS) PYTHON=python3.12"; exit 1; }
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { \
	  echo "make: '$(PYTHON)' cannot create a virtual environment; Debian/Ubuntu: apt-get install python3-venv"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	touch $@

$(VENV)/.demo: pyproject.toml $(VENV)/.created
	$(PY) -m pip install -q -e '.[demo]'
	touch $@

# uv installs the ~80 packages (and compiles their ~12,000 modules) in about half pip's time,
# a sixth of a fresh clone's `make test` otherwise; where it cannot be had, pip does it.
$(VENV)/.installed: pyproject.toml $(VENV)/.created
	{ $(PY) -m pip install -q uv && $(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode -e '.[dev]'; } \
	  || $(PY) -m pip install -q -e '.[dev]'
	touch $@ $(VENV)/.demo

demo: $(VENV)/.demo
	$(PY) manage.py migrate --no-input -v 0
	DEMO_SCHEDULES=1 $(PY) manage.py rundemo

# The manual, as CI builds it: every warning (a link to a page or a section that does not
# exist, a bad directive) is an error.
docs: $(VENV)/.installed
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@echo "the manual: docs/_build/html/index.html"

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy feishu_inbox project
	$(PY) manage.py check
	$(PY) manage.py makemigrations --check --dry-run
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@rm -rf dist/lint && mkdir -p dist && $(PY) -m build --no-isolation --outdir dist/lint . > dist/build.log 2>&1 || { cat dist/build.log; exit 1; }
	$(VENV)/bin/twine check --strict dist/lint/*

# Each suite runs on TEST_PROCESSES pytest-xdist processes (each with its own test database):
# its tests mostly wait on worker subprocesses, servers and the browser.
TEST_PROCESSES ?= 2

# The suites start a few hundred Python subprocesses (workers, servers, commands): each would
# compile the project's modules again where PYTHONDONTWRITEBYTECODE is set (a seventh of a
# worker's start-up). Compile them once, before the suites.
bytecode: $(VENV)/.installed
	@$(PY) -m compileall -q -j 0 feishu_inbox project tests

test-sqlite: $(VENV)/.installed bytecode
	env -u DATABASE_URL FEISHU_INBOX_READ_DOTENV=0 $(VENV)/bin/pytest -n $(TEST_PROCESSES) $(PYTEST_ARGS)

# PostgreSQL is required: a run that cannot reach it fails, it never passes by skipping.
# The suite creates and drops its own test databases. The tests marked any_database use no
# test database (the SQLite suite runs them). Exit 5 is "no test selected" (a PYTEST_ARGS
# selection without any of them).
test-postgres: $(VENV)/.installed bytecode
	DATABASE_URL=$(PG_URL) FEISHU_INBOX_READ_DOTENV=0 $(VENV)/bin/pytest -n $(TEST_PROCESSES) -m "not stops_postgres and not any_database" $(PYTEST_ARGS) || [ $$? = 5 ]

# The tests that stop the whole cluster (a restart under load) run on a throwaway cluster of
# their own (initdb on a free port; needs the server's binaries, which a PostgreSQL install
# has), in one process, beside everything else: stopping it fails no other test.
test-postgres-outages: $(VENV)/.installed bytecode
	FEISHU_INBOX_READ_DOTENV=0 $(PY) -m tests.support.private_postgres $(PY) -m pytest -m stops_postgres $(PYTEST_ARGS) || [ $$? = 5 ]

# The browser tests fail without Chromium (they never skip): say so before a 3-minute run.
chromium:
	@command -v $(CHROMIUM) >/dev/null 2>&1 || { \
	  echo "make test: no Chromium at $(CHROMIUM) for the browser tests. Debian/Ubuntu: apt-get install chromium (or CHROMIUM=/path/to/chromium)"; exit 1; }

# The metrics tests scrape a real worker with a real Prometheus (they never skip either).
prometheus:
	@command -v $(PROMETHEUS) >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || { \
	  echo "make test: no Prometheus at $(PROMETHEUS) (or no promtool) for the metrics tests. Debian/Ubuntu: apt-get install prometheus"; exit 1; }

# The lint and the two suites run side by side: each suite spends most of its time waiting on
# worker subprocesses, servers and the browser, so together they take about as long as the
# longer one alone (each has its own database; PG_URL's is PostgreSQL's, SQLite's a file of
# its own). --output-sync prints each one's output whole, when it ends; any failure fails it.
test: chromium prometheus $(VENV)/.installed
	@$(MAKE) --no-print-directory -j4 --output-sync=target test-all

test-all: lint test-sqlite test-postgres test-postgres-outages

test-fast: $(VENV)/.installed
	env -u DATABASE_URL FEISHU_INBOX_READ_DOTENV=0 $(PY) -m pytest -x --failed-first -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache db.sqlite3* test-db.sqlite3* staticfiles dist docs/_build
