# dcp-bench: the two commands a new user needs are `make reproduce` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# KIT=DIR: install from that folder of wheels with no network (`make kit KIT=DIR` builds it where
# there is network; docs/profiling.md, "Offline kit"). Without KIT, pip reaches the package index,
# and pip itself is upgraded only when the index answers.
KIT ?=
PIP_FROM := $(if $(KIT),--no-index --find-links $(KIT) --no-build-isolation,)

.PHONY: setup test test-slow test-gpu bench lint reproduce report-screenshots clean kit

setup: $(STAMP)

# Set-up prints the step it is on (a fresh clone's first set-up takes minutes: torch alone is a
# large download); pip's own output stays quiet.
$(STAMP): pyproject.toml
	@echo "setup: 1/3 creating the virtual environment $(VENV)"
	# The venv sees the system's packages, so an image's own torch (a CUDA build) is used as it is.
	test -x $(PY) || python3 -m venv --system-site-packages $(VENV)
	$(if $(KIT),,$(PY) -m pip index versions pip --timeout 5 --retries 0 >/dev/null 2>&1 && $(PY) -m pip install -q --upgrade pip || echo "setup: package index unreachable: pip not upgraded")
	@echo "setup: 2/3 torch (already there, or torch==2.13.0, a large download, can take minutes)"
	# torch is pinned here only when it is missing: the CPU machines this suite is developed on
	# carry a local torch 2.13.0 CPU wheel, and an unpinned resolve would pull a multi-GB CUDA
	# build. GPU users install their own CUDA torch first; the pyproject range stays open.
	$(PY) -c "import torch" 2>/dev/null || $(if $(KIT),{ echo "setup: no torch in $(PY) and KIT=$(KIT) installs none: use a Python that has torch"; exit 1; },$(PY) -m pip install -q torch==2.13.0)
	@echo "setup: 3/3 installing dcp-bench and its dependencies$(if $(KIT), from $(KIT),)"
	# With KIT the development tools are not installed (the kit carries the runtime only).
	$(PY) -m pip install -q $(PIP_FROM) -e ".$(if $(KIT),,[dev,hf])"
	touch $(STAMP)
	@echo "setup: done ($(VENV))"

# The offline kit: this project's wheel and the dependencies a GPU image lacks, for Python 3.12.
kit:
	scripts/offline_kit.sh $(or $(KIT),dist/kit)

test: setup
	$(PY) -m pytest -q -m "not slow and not gpu" -p no:cacheprovider

# Slow checks launch many torchrun / gloo jobs on an oversubscribed CPU: a failure is rerun once,
# and pytest reports every rerun, so a flaky launch is visible rather than hidden.
test-slow: setup
	$(PY) -m pytest -q -m "slow and not gpu" -p no:cacheprovider --reruns 1 -rR

# Checks that need a CUDA device (marker `gpu`; skipped with the reason where there is none).
test-gpu: setup
	$(PY) -m pytest -q -m gpu -p no:cacheprovider

bench: setup
	$(PY) -m pytest -q tests/benchmarks --benchmark-enable --benchmark-only -p no:cacheprovider

lint: setup
	$(VENV)/bin/ruff check dcp_bench baselines tests scripts tools
	$(VENV)/bin/ruff format --check dcp_bench baselines tests scripts tools
	$(VENV)/bin/mypy dcp_bench baselines tools

# No time limit by default: every section runs to its end, with progress and an estimate of what
# is left on stderr; ARGS="budget_s=600" is passed to the command (a wall-clock bound, report
# included). GNU make exits 2 for any failing recipe, whatever the recipe's own status: the last
# line names dcp-bench's own status (4: an incomplete reproduction, its report written) and
# scripts/reproduce.sh exits with it.
ARGS ?=
reproduce: setup
	@$(VENV)/bin/dcp-bench reproduce $(ARGS); status=$$?; \
	if [ $$status -ne 0 ]; then echo "make reproduce: dcp-bench reproduce exited $$status" \
	"(2 bad input, 4 incomplete reproduction: its report is written; scripts/reproduce.sh exits" \
	"with that status)" >&2; fi; exit $$status

# The first screen of reports/reproduce/report.html as a reviewer sees it (headless Chromium, 1400 px
# wide): reports/reproduce/first_screen.png, and the rendered page's layout check.
report-screenshots: setup
	$(PY) scripts/report_screenshots.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
