#!/usr/bin/env bash
# GPU check in one go: installs what is missing, runs the GPU tests and
# `packtool verify --backend flash` (plus varlen/sdpa) on a packed sample, printing the report.
# Usage: scripts/gpu_check.sh   (from anywhere; needs a CUDA GPU)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || echo "nvidia-smi missing"
if ! $PY -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "installing a CUDA torch"; $PY -m pip install -q torch || exit 1
fi
$PY -c "import packtool" 2>/dev/null || $PY -m pip install -q -e ".[dev,verify]" || exit 1
$PY -c "import pytest, transformers" 2>/dev/null || $PY -m pip install -q pytest hypothesis transformers
if ! $PY -c "from flash_attn import flash_attn_varlen_func" 2>/dev/null; then
  echo "installing flash-attn"; $PY -m pip install -q flash-attn --no-build-isolation \
    || echo "flash-attn could not be installed: the flash backend will be reported as skipped"
fi
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
OUT=$(mktemp -d)
rc=0
$PY -m pytest -q -m gpu tests/verify || rc=1
$PY -m packtool pack --capacity 2048 --quiet --overwrite sample_data/ "$OUT/packed" || rc=1
$PY -m packtool verify "$OUT/packed" --rows 16 --backend flash --backend varlen --backend sdpa || rc=1
$PY -m packtool verify "$OUT/packed" --rows 16 --backend flash --json > "$OUT/verify_flash.json" || rc=1
echo "gpu_check exit status: $rc"
exit $rc
