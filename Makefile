# streamworks — the newcomer's commands are `make demo` and `make test`.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
#: Suites that run on a Redis Cluster (`make test-cluster`); tests marked `cluster` in
#: them (and elsewhere) run on both a single node and the cluster in `make test`.
CLUSTER_TESTS ?= tests/cluster tests/coordinator tests/resharding tests/runtime tests/redis
STAMP   := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: venv demo test test-cluster lint format docs bench chaos screenshots constraints clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -U pip
	$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

demo: venv ## run the orders example end to end on an embedded Redis
	$(PY) -m examples.orders.demo

test: venv ## the whole test suite (embedded Redis unless STREAMWORKS_TEST_REDIS_URL is set)
	$(VENV)/bin/pytest -q

test-cluster: venv ## every cluster-parametrized suite on a local Redis Cluster (3 masters + 3 replicas)
	$(VENV)/bin/pytest -q --redis-target=cluster $(CLUSTER_TESTS)

lint: venv ## ruff + mypy strict + the import contract of the layers (.importlinter)
	$(VENV)/bin/ruff check streamworks tests bench examples
	$(VENV)/bin/ruff format --check streamworks tests bench examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

format: venv
	$(VENV)/bin/ruff check --fix streamworks tests bench examples
	$(VENV)/bin/ruff format streamworks tests bench examples

DOCS_STAMP := $(VENV)/.docs-$(shell cksum pyproject.toml | cut -d' ' -f1)

$(DOCS_STAMP): $(STAMP)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[dev,docs]'
	rm -f $(VENV)/.docs-*
	touch $@

docs: $(DOCS_STAMP) ## the documentation site into site/: --strict, then every link of the built pages (a dead one fails; DOCS_EXTERNAL=1 also asks external ones)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site
	$(PY) -m tests.docs.link_check site $(if $(DOCS_EXTERNAL),--external)

.PHONY: model
model: ## the Quint model of the protocol: typecheck, witness tests, seeded exploration (spec/run.sh)
	@spec/run.sh

bench: venv ## the benchmark suite: raw redis-py and the peers, in one run
	$(VENV)/bin/pip install -q --disable-pip-version-check -r bench/requirements.txt
	$(PY) bench/run_all.py

chaos: venv ## fault injection: 30 min of seeded faults, then the checker (CHAOS_ARGS="--seed N --duration S")
	$(PY) -m tests.chaos $(CHAOS_ARGS)

screenshots: venv ## the browser test, saving the dashboard screenshots docs/ shows (needs chromium)
	STREAMWORKS_SCREENSHOTS=docs/img $(VENV)/bin/pytest -q tests/browser

constraints: ## rebuild deploy/constraints.txt, the Docker image's pinned dependencies
	rm -rf .constraints-venv
	$(PYTHON) -m venv .constraints-venv
	.constraints-venv/bin/pip install -q --disable-pip-version-check .
	{ sed -n '/^#/p' deploy/constraints.txt; \
	  .constraints-venv/bin/pip freeze --exclude streamworks --disable-pip-version-check; \
	} > deploy/constraints.txt.new
	mv deploy/constraints.txt.new deploy/constraints.txt
	rm -rf .constraints-venv

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
