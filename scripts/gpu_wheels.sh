#!/usr/bin/env bash
# Prepare the wheels scripts/gpu_check.sh installs on a GPU machine that reaches no package index:
# flash-attn, causal-conv1d and mamba-ssm (and what they need beyond torch), built for this
# machine's Python, torch, CUDA and C++ ABI.
#
# Run it on a machine with the package index and the SAME Python, torch (CUDA build) and CUDA
# version as the GPU machine (the GPU machine itself, while it still has the index, is best):
#
#   scripts/gpu_wheels.sh wheels/          # then copy wheels/ over and run
#   GPU_CHECK_WHEELS=wheels/ scripts/gpu_check.sh
#
# The three packages publish prebuilt CUDA wheels for common torch / CUDA / ABI combinations:
# building one with `pip wheel` fetches the matching prebuilt binary instead of compiling (a CUDA
# source build takes tens of minutes to hours). If none matches, pip compiles, and says so; set
# MAX_JOBS to bound the memory that takes.
# Environment: PY (python, default .venv/bin/python or python3), FLASH_ATTN, CAUSAL_CONV1D,
#   MAMBA_SSM (pip requirement strings, default the latest releases).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:?usage: scripts/gpu_wheels.sh DIR}
PY=${PY:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
mkdir -p "$DIR"
$PY -c "import torch, sys
if not torch.version.cuda:
    sys.exit('gpu_wheels: this torch is a CPU build; install the CUDA build the GPU machine uses')
print('gpu_wheels: python', sys.version.split()[0], 'torch', torch.__version__, 'cuda',
      torch.version.cuda, 'cxx11abi', torch._C._GLIBCXX_USE_CXX11_ABI)"
# their build step imports torch: no build isolation; dependencies torch already brings are skipped
$PY -m pip wheel --no-deps --no-build-isolation -w "$DIR" \
  "${FLASH_ATTN:-flash-attn}" "${CAUSAL_CONV1D:-causal-conv1d}" "${MAMBA_SSM:-mamba-ssm}"
# pure-Python requirements of the three that a bare environment may lack
$PY -m pip download --no-deps -d "$DIR" einops ninja packaging
ls -l "$DIR"
echo "gpu_wheels: done; on the GPU machine run GPU_CHECK_WHEELS=$DIR scripts/gpu_check.sh"
