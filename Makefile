# dcp-bench: the two commands a new user needs are `make reproduce` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test test-slow bench lint reproduce report-screenshots clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned here only when it is missing: the CPU machines this suite is developed on
	# carry a local torch 2.13.0 CPU wheel, and an unpinned resolve would pull a multi-GB CUDA
	# build. GPU users install their own CUDA torch first; the pyproject range stays open.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q -m "not slow and not gpu" -p no:cacheprovider

# Slow checks launch many torchrun / gloo jobs on an oversubscribed CPU: a failure is rerun once,
# and pytest reports every rerun, so a flaky launch is visible rather than hidden.
test-slow: setup
	$(PY) -m pytest -q -m "slow and not gpu" -p no:cacheprovider --reruns 1 -rR

bench: setup
	$(PY) -m pytest -q tests/benchmarks --benchmark-enable --benchmark-only -p no:cacheprovider

lint: setup
	$(VENV)/bin/ruff check dcp_bench baselines tests
	$(VENV)/bin/mypy dcp_bench baselines

reproduce: setup
	$(VENV)/bin/dcp-bench reproduce

# The first screen of reports/reproduce/report.html as a reviewer sees it (headless Chromium, 1400 px
# wide): reports/reproduce/first_screen.png, and the rendered page's layout check.
report-screenshots: setup
	$(PY) scripts/report_screenshots.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
