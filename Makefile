# Two commands do all set-up on a fresh machine with Python >= 3.10 and make:
#   make demo   # create .venv, install, pack sample_data/ into out/, print the stats
#   make test   # create .venv if needed, run the whole test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# the CPU build of torch; a bare `torch` requirement would pull a multi-GB CUDA build
TORCH ?= torch==2.13.0

.PHONY: install demo test test-nojit test-gpu bench sample clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev,verify]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/packtool pack --capacity 2048 --overwrite sample_data/ out/
	$(BIN)/packtool stats out/

test: $(STAMP)
	$(BIN)/python -m pytest -q

# the same tests with the Numba kernels run as plain Python (coverage of kernel bodies)
test-nojit: $(STAMP)
	NUMBA_DISABLE_JIT=1 $(BIN)/python -m pytest -q tests/core

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu

bench: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[bench]"
	$(BIN)/python scripts/bench_packer.py
	$(BIN)/python scripts/bench_pipeline.py --encodings

sample: $(STAMP)
	$(BIN)/python scripts/make_sample_data.py

clean:
	rm -rf $(VENV) out .pytest_cache
