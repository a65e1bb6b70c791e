# Two commands do all set-up on a fresh machine with Python >= 3.10 and make (on Debian and
# Ubuntu also the python3-venv package), downloading from PyPI (torch: its CPU index, below):
#   make demo   # create .venv, install packtool, pack sample_data/ into out/, print the stats
#   make test   # create .venv if needed, install the test dependencies, run the whole suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
CORE_STAMP := $(VENV)/.core-stamp
STAMP := $(VENV)/.installed-stamp
# torch for verify, the loader and the tests: TORCH_BUILD=auto picks the CPU-only build
# (torch==VERSION+cpu) on a machine without an NVIDIA GPU and PyPI's default CUDA build on one
# with a GPU; TORCH_BUILD=cpu|cuda forces one; TORCH_INDEX=URL takes torch from that index
# (e.g. https://download.pytorch.org/whl/cu128). See scripts/install_torch.sh.
TORCH_VERSION ?= 2.13.0
TORCH_BUILD ?= auto
TORCH_INDEX ?=
# the versions the suite last passed with (test-constraints.txt); CONSTRAINTS= takes the newest
CONSTRAINTS ?= test-constraints.txt

.PHONY: install demo test test-nojit test-gpu bench docs sample clean

$(BIN)/python:
	@echo "==> creating the virtual environment $(VENV) with $(PY)"
	$(PY) -m venv $(VENV)
	@echo "==> upgrading pip inside $(VENV)"
	$(PIP) install -q --upgrade pip

# packtool with its runtime dependencies only: what `make demo` needs
$(CORE_STAMP): pyproject.toml | $(BIN)/python
	@echo "==> installing packtool and numpy, numba, pyarrow, click, tqdm into $(VENV)" \
	      "(about 100 MB, a minute or two)"
	$(PIP) install --progress-bar on -e .
	touch $@

# everything the tests use: torch, transformers, matplotlib, ray, pytest, hypothesis
$(STAMP): pyproject.toml $(CONSTRAINTS) $(CORE_STAMP)
	@sh scripts/install_torch.sh $(BIN)/python $(TORCH_VERSION) $(TORCH_BUILD) "$(TORCH_INDEX)"
	@echo "==> installing the test dependencies and the verify, hf, plot and ray extras" \
	      "(a few minutes on a fresh machine)"
	$(PIP) install --progress-bar on -e ".[dev]" $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	touch $@

install: $(STAMP)

demo: $(CORE_STAMP)
	@echo "==> packing sample_data/ into out/ at capacity 2048"
	$(BIN)/packtool pack --capacity 2048 --overwrite sample_data/ out/
	@echo "==> the figures of out/, recounted from its shards"
	$(BIN)/packtool stats out/

# two test processes (pytest-xdist), each test module on one of them (its fixtures built once)
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadscope

# the core tests with the Numba kernels run as plain Python (coverage of kernel bodies), and
# whole packs and pack_dataset run that way, byte for byte against the compiled ones
test-nojit: $(STAMP)
	NUMBA_DISABLE_JIT=1 $(BIN)/python -m pytest -q tests/core tests/test_nojit.py

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu

bench: $(STAMP)
	$(PIP) install -q -e ".[bench]"
	$(BIN)/python scripts/bench_packer.py
	$(BIN)/python scripts/bench_pipeline.py --encodings

# README's compare table and docs/img/*.png from sample_data/ (tests/test_docs.py checks the
# table); VERIFY=1 also reruns packtool verify for README's verify figures (minutes)
docs: $(STAMP)
	$(BIN)/python scripts/readme_figures.py $(if $(VERIFY),--verify)

sample: $(STAMP)
	$(BIN)/python scripts/make_sample_data.py

clean:
	rm -rf $(VENV) out .pytest_cache
