# indusflow: `make demo` installs and runs the main job; `make test` installs and runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch build to install when the venv has none. On a machine without a GPU this is the
# CPU build: here it lies on disk; elsewhere add TORCH_INDEX=https://download.pytorch.org/whl/cpu.
# GPU users: install your own torch into $(VENV) first (or set TORCH_SPEC); it is kept.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
PORT ?= 4200
# uv (pinned in constraints.txt: Flower needs it) installs the project's packages, the same 291 versions
# as pip: make install 1:10 instead of 2:51 on a fresh clone, 2 cores (parallel downloads, bytecode compiled
# on every core; bench/results/test_durations_2026-12-07.md, session 10). uv reads its own settings, not
# pip's: behind a private index set UV_INDEX_URL. torch stays with pip, whose settings may name its build.
UV := $(VENV)/bin/uv

.PHONY: install constraints demo test test-fast test-docs docs docs-build lint ui bench clean-home

$(VENV)/.installed: pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "torch $$($(PY) -c 'import torch; print(torch.__version__)') already installed: keeping it"; \
	else \
		echo "installing $(TORCH_SPEC) $(if $(TORCH_INDEX),from $(TORCH_INDEX))"; \
		$(PY) -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)); \
	fi
	$(PY) -m pip install -q -c constraints.txt uv
	$(UV) pip install --python $(PY) --compile-bytecode -q -c constraints.txt -e ".[all,dev,docs]"
	@# statsforecast 2.1 (python -m flows.sensor forecast) and fugue pin pandas<3: beside pandas 3 without the pin
	$(UV) pip install --python $(PY) --compile-bytecode -q --no-deps "statsforecast==2.1.1" "coreforecast==0.0.20" \
		"utilsforecast==0.2.17" "statsmodels==0.15.0" "patsy==1.0.3" "formulaic==1.2.2" "interface_meta==2.0.1" \
		"fugue==0.9.7" "triad==1.0.4" "adagio==0.2.6"
	@touch $@

install: $(VENV)/.installed

# The versions of a working install, pinned for the next one (make install, .ci/run, the Dockerfile):
# after changing a dependency in pyproject.toml, install, run the tests, then regenerate and commit.
# torch is left to the machine (CPU or CUDA build), the project itself to the install.
constraints:
	$(PY) -m pip freeze --exclude-editable --exclude torch --exclude indusflow | LC_ALL=C sort -f > constraints.txt

demo: install
	$(PY) -m flows.fraud train

# Three pytest-xdist workers by default: many tests wait on a server or a subprocess, so three workers
# keep two cores busy (each worker has its own home, Prefect test API and ports: tests/conftest.py; one
# thread per test process). A file's tests stay on one worker (--dist loadfile), so a module's fixtures
# are built once; the files run tier by tier, the long waiting tiers first (tests/conftest.py TIER_ORDER,
# --no-loadscope-reorder). Measured on a clean clone (2 cores, load 1-8, bench/results/test_durations_2026-12-07.md):
# 2 workers 20:47, 3 workers 16:51 (both in xdist's default order), 3 workers tier by tier 13:58.
# TEST_WORKERS=0: the tests run in this process.
TEST_WORKERS ?= 3
# The docs tier on two workers (a chain of sections that need one another on one, each section run once;
# their commands unpinned, one thread each: tests/docs/harness.py): 16 sections passed in 9:49 on a clean
# clone (bench/results/test_durations_2026-12-07.md, session 10; 14:38-15:54 while pytest 9.2 broke
# --dist loadgroup and both workers ran the long chains). DOCS_WORKERS=0: in this process.
DOCS_WORKERS ?= 2
XDIST = $(if $(filter-out 0,$(2)),-n $(2) --dist $(1))

test: install
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -m "not docs_run" --durations=25 $(call XDIST,loadfile,$(TEST_WORKERS)) \
		$(if $(filter-out 0,$(TEST_WORKERS)),--no-loadscope-reorder)

# The tier a developer runs often (a few minutes on 2 cores): the import contracts and the unit
# tests that start no server and train no flow-sized model (`slow` and `gpu` are left out).
test-fast: install
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q tests/unit -m "not slow and not gpu"

# Runs every command block of README.md and docs/ as written, section by section, each in its own home
# (tests/docs; one section and the sections it needs: make test-docs K=serving). A section and the sections
# it needs run on one worker (--dist loadgroup: tests/docs/test_docs.py groups each chain of needs).
K ?=
test-docs: install
	$(PY) -m pytest -q -m docs_run $(if $(K),-k $(K)) $(call XDIST,loadgroup,$(DOCS_WORKERS))

# The documentation site (MkDocs + Material, mkdocs.yml): served with live reload on 127.0.0.1:8001,
# or built with every warning an error into site/ (make test runs the same strict build).
docs: install
	$(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8001

docs-build: install
	$(VENV)/bin/mkdocs build --strict

lint: install
	$(VENV)/bin/ruff check flows tasks solutions infra tests bench
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(VENV)/bin/deptry .
	$(VENV)/bin/shellcheck bench/*.sh

ui: install
	@echo "Prefect UI: http://127.0.0.1:$(PORT)  (then, in the shell that runs flows: export PREFECT_API_URL=http://127.0.0.1:$(PORT)/api)"
	PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_UI_API_URL=http://127.0.0.1:$(PORT)/api \
		$(PY) -m infra.prefect_server --host 127.0.0.1 --port $(PORT)

bench: install
	$(PY) bench/fraud_bench.py
	$(PY) bench/deploy_bench.py
