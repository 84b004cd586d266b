# The two commands of the README:
#   make demo   the demo on SQLite: webhook server + worker (creates .venv on first use)
#   make test   lint, type-check, checks, and the whole suite on SQLite and on PostgreSQL
#   make test-fast   the inner loop: the SQLite suite alone, stopping at the first failure
#
# Needs make and a Python >= 3.10 that can create virtual environments (Debian/Ubuntu:
# apt-get install make python3-venv). PYTHON chooses it: make test PYTHON=python3.12.
# make test also needs PostgreSQL (PG_URL, and the server's binaries), Chromium (CHROMIUM) for
# the browser tests and Prometheus (PROMETHEUS: Debian's prometheus package, with promtool) for
# the metrics tests: `make setup` (run by make test) installs what is missing with apt-get when
# it runs as root, otherwise it prints the one command that does.
#   make test-stress N=5   the suites N times while a CPU hog takes every cycle they leave
#   make test-stacks   the built wheel in clean environments, one per Python/Django stack (PyPI)
PYTHON ?= python3
VENV ?= .venv
CHROMIUM ?= /usr/bin/chromium
export CHROMIUM
PROMETHEUS ?= /usr/bin/prometheus
PY := $(VENV)/bin/python
# One database name per checkout, so two checkouts on one machine never drop each other's
# test database (test_feishu_inbox_<hash>).
PG_URL ?= postgres://postgres@127.0.0.1:5432/feishu_inbox_$(shell pwd | cksum | cut -d' ' -f1)

.PHONY: demo docs bytecode setup postgres test test-fast test-stress lint test-sqlite test-postgres test-postgres-outages test-postgres-topologies test-stacks test-all clean

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

# JUNIT_DIR (make test-stress sets it per round): each suite writes its JUnit XML there.
junit = $(if $(JUNIT_DIR),--junitxml=$(JUNIT_DIR)/$(1).xml)

# The stacks tests (make test-stacks) are no part of the two suites: they download.
test-sqlite: $(VENV)/.installed bytecode
	env -u DATABASE_URL FEISHU_INBOX_READ_DOTENV=0 $(VENV)/bin/pytest -n $(TEST_PROCESSES) -m "not stacks" $(call junit,sqlite) $(PYTEST_ARGS)

# PostgreSQL is required: a run that cannot reach it fails, it never passes by skipping.
# The suite creates and drops its own test databases. The tests marked any_database use no
# test database (the SQLite suite runs them). Exit 5 is "no test selected" (a PYTEST_ARGS
# selection without any of them).
test-postgres: $(VENV)/.installed bytecode
	DATABASE_URL=$(PG_URL) FEISHU_INBOX_READ_DOTENV=0 $(VENV)/bin/pytest -n $(TEST_PROCESSES) -m "not stops_postgres and not any_database and not stacks and not topology" $(call junit,postgres) $(PYTEST_ARGS) || [ $$? = 5 ]

# The tests that stop the whole cluster (a restart under load) run on a throwaway cluster of
# their own (initdb on a free port; needs the server's binaries, which a PostgreSQL install
# has), in one process, beside everything else: stopping it fails no other test.
test-postgres-outages: $(VENV)/.installed bytecode
	FEISHU_INBOX_READ_DOTENV=0 $(PY) -m tests.support.private_postgres $(PY) -m pytest -m stops_postgres $(call junit,postgres-outages) $(PYTEST_ARGS) || [ $$? = 5 ]

# PostgreSQL in production's shapes (docs/production.md, "PostgreSQL topology"), beside the
# other suites, on a database name of its own: the tests marked topology (each runs its own
# PgBouncer, or a throwaway primary and a pg_basebackup standby on free ports: the failover,
# the held snapshot), then the worker, steps, schedules, replies and streams tests again with
# every subprocess behind PgBouncer in transaction mode (tests/support/pgbouncer.py).
PG_URL_TOPOLOGIES ?= $(PG_URL)_topologies
TOPOLOGY_SUITE = tests/runtime/test_worker.py tests/runtime/test_batches.py \
  tests/runtime/test_steps.py tests/runtime/test_worker_faults.py \
  tests/schedules/test_schedule_workers.py tests/feishu/test_http_server.py \
  tests/feishu/test_reply_workers.py tests/feishu/test_stream_workers.py \
  tests/backfills/test_export_workers.py::test_a_workers_memory_stays_flat_over_a_million_rows
# The two run one after the other (they share the database name), the second whether or not
# the first passed, so that a run reports the failures of both.
test-postgres-topologies: $(VENV)/.installed bytecode
	@failed=0; \
	DATABASE_URL=$(PG_URL_TOPOLOGIES) FEISHU_INBOX_READ_DOTENV=0 $(VENV)/bin/pytest -n $(TEST_PROCESSES) -m topology $(call junit,postgres-topologies) $(PYTEST_ARGS) || [ $$? = 5 ] || failed=1; \
	DATABASE_URL=$(PG_URL_TOPOLOGIES) FEISHU_INBOX_TEST_TOPOLOGY=pgbouncer FEISHU_INBOX_READ_DOTENV=0 $(VENV)/bin/pytest -n $(TEST_PROCESSES) -m "not stops_postgres and not any_database and not stacks and not topology" $(call junit,postgres-pgbouncer) $(if $(PYTEST_ARGS),$(PYTEST_ARGS),$(TOPOLOGY_SUITE)) || [ $$? = 5 ] || failed=1; \
	exit $$failed

# The built wheel installed into a clean virtual environment per stack the README names (each
# Python 3.10-3.13 the machine has, with Django 5.2 or 6.x), the base package and then each
# extra, from PyPI through uv's (or pip's) own cache: tests/site/test_stacks.py. The PostgreSQL
# stack makes and drops a database of its own on PG_URL's server.
test-stacks: $(VENV)/.installed
	env -u DATABASE_URL PG_URL=$(PG_URL) FEISHU_INBOX_READ_DOTENV=0 $(VENV)/bin/pytest -n $(TEST_PROCESSES) -m stacks tests/site/test_stacks.py $(call junit,stacks) $(PYTEST_ARGS)

# What the suites need beyond Python, as COMMAND=PACKAGE (Debian/Ubuntu): Chromium for the
# browser tests and Prometheus with promtool for the metrics tests (they never skip: a run
# without them fails), the PostgreSQL server's binaries (the tests that stop PostgreSQL run a
# throwaway cluster of their own) and its client's pg_isready. make test-stress adds stress-ng.
# PgBouncer (the topology suite runs its own, on free ports) too.
SETUP_NEEDS = $(CHROMIUM)=chromium $(PROMETHEUS)=prometheus promtool=prometheus \
  initdb=postgresql pg_isready=postgresql-client pgbouncer=pgbouncer
# A command is there if it is on PATH, in /usr/sbin (pgbouncer), or (initdb, pg_ctl) in
# Debian's PostgreSQL bindir.
have = command -v "$$1" >/dev/null 2>&1 || [ -x /usr/sbin/"$$1" ] || ls /usr/lib/postgresql/*/bin/"$$1" >/dev/null 2>&1

# Installs what is missing with apt-get (the package lists updated once, first) when it runs as
# root, as CI and a fresh container do; otherwise says the one command that installs it all.
setup:
	@have() { $(have); }; missing=""; \
	for need in $(SETUP_NEEDS); do have "$${need%%=*}" || missing="$$missing $${need#*=}"; done; \
	missing=$$(printf '%s\n' $$missing | sort -u | tr '\n' ' ' | sed 's/ *$$//'); \
	[ -z "$$missing" ] && exit 0; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make $(or $(MAKECMDGOALS),test): missing $$missing; install it (Debian/Ubuntu): sudo apt-get update && sudo apt-get install -y $$missing"; exit 1; fi; \
	echo "== make setup: apt-get install $$missing"; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
	case " $$missing " in *" pgbouncer "*) \
	  echo "== make setup: the pgbouncer service the package starts is stopped and disabled (the tests run their own)"; \
	  systemctl disable --now pgbouncer >/dev/null 2>&1 || service pgbouncer stop >/dev/null 2>&1 || true;; esac; \
	for need in $(SETUP_NEEDS); do have "$${need%%=*}" || { \
	  echo "make setup: still no $${need%%=*} after installing $${need#*=} (a path of your own? CHROMIUM=/path/to/chromium, PROMETHEUS=…)"; exit 1; }; done

# The PostgreSQL server at PG_URL: as root, a Debian cluster that is installed but not running
# is started (as a fresh container's is); a server that still does not answer fails here, not
# three minutes into the suite.
postgres: setup
	@pg_isready -q -d "$(PG_URL)" && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then \
	  version=$$(ls /etc/postgresql | sort -V | tail -1); echo "== make postgres: pg_ctlcluster $$version main start"; \
	  pg_ctlcluster --skip-systemctl-redirect "$$version" main start || true; \
	  for _ in $$(seq 1 30); do pg_isready -q -d "$(PG_URL)" && exit 0; sleep 1; done; fi; \
	echo "make test: no PostgreSQL answers at $(PG_URL) (user postgres, trust auth on 127.0.0.1; PG_URL=postgres://… to choose another)"; exit 1

# The lint, the two suites and the stacks run side by side: each suite spends most of its time
# waiting on worker subprocesses, servers, the browser and downloads, so together they take
# about as long as the longest one alone (each has its own database; PG_URL's is PostgreSQL's,
# SQLite's a file of its own). --output-sync prints each one's output whole, when it ends; any failure fails it.
test: setup postgres $(VENV)/.installed
	@$(MAKE) --no-print-directory -j6 --output-sync=target test-all

test-all: lint test-sqlite test-postgres test-postgres-outages test-postgres-topologies test-stacks

# The suites (the SQLite and PostgreSQL ones side by side, as make test runs them) N times back
# to back while a CPU hog at nice 19 (stress-ng, else Python loops) takes every cycle they leave;
# then every test that failed at least once, with its round and its failure's first lines
# (tests/support/stress.py; each round's output in .stress/round-N.log). A subset:
# make test-stress N=3 PYTEST_ARGS="tests/runtime tests/feishu".
N ?= 1
test-stress: SETUP_NEEDS += stress-ng=stress-ng
test-stress: setup postgres $(VENV)/.installed bytecode
	$(PY) -m tests.support.stress --rounds $(N) --out .stress -- \
	  $(MAKE) --no-print-directory -j4 --output-sync=target test-sqlite test-postgres test-postgres-outages test-postgres-topologies

test-fast: $(VENV)/.installed
	env -u DATABASE_URL FEISHU_INBOX_READ_DOTENV=0 $(PY) -m pytest -x --failed-first -q -m "not stacks" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .stress .pytest_cache .mypy_cache .ruff_cache db.sqlite3* test-db.sqlite3* staticfiles dist docs/_build
