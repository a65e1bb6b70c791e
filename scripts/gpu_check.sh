#!/usr/bin/env bash
# Every backend on the GPU, in one go, on the packed sample data:
#   sdpa (CUDA, float32), flex (compiled, forward and backward, CUDA, float32),
#   varlen (torch.nn.attention.varlen, bfloat16), flash (flash_attn_varlen_func, bfloat16,
#   tolerance 2 * max|eager_bf16 - ref| + 1e-3), hybrid (convolution + gated linear recurrence
#   reset by seq_idx, plain torch) and mamba (the same mixers through causal-conv1d and
#   mamba-ssm with seq_idx, float32); then the same backends on the sample data packed with
#   --segment-multiple 8 (context-parallel layout: padding inside rows, flash-attn varlen on the
#   padded cu_seqlens); then the GPU tests (pytest -m gpu).
# Prints one line per backend and output and exits 0 only when every backend ran and passed. A
# backend that cannot run (no CUDA, flash-attn, causal-conv1d or mamba-ssm missing or not
# importable) is a failure, never a skip.
#
# Usage: scripts/gpu_check.sh            (from anywhere; needs a CUDA GPU; about 3-6 minutes)
# Environment: PY (python to use, default .venv/bin/python or python3), ROWS (rows per backend,
#   default 16), GPU_CHECK_OUT (work directory, default a new temporary one), GPU_CHECK_DATA
#   (tokenized input to pack, default sample_data/), CAPACITY (default 2048), GPU_CHECK_TESTS
#   (0 skips the GPU tests), GPU_CHECK_WHEELS (a directory of prebuilt wheels made by
#   scripts/gpu_wheels.sh on a machine with the package index: flash-attn, causal-conv1d and
#   mamba-ssm are installed from it with --no-index; without it a missing flash-attn is
#   installed from the index, and missing causal-conv1d / mamba-ssm fail the check, since
#   building their CUDA code takes far longer than the check), SEGMENT_MULTIPLE (default 8).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
ROWS=${ROWS:-16}
DATA=${GPU_CHECK_DATA:-sample_data/}
CAPACITY=${CAPACITY:-2048}
OUT=${GPU_CHECK_OUT:-$(mktemp -d)}
WHEELS=${GPU_CHECK_WHEELS:-}
MULTIPLE=${SEGMENT_MULTIPLE:-8}
BACKENDS=(sdpa flex varlen flash hybrid mamba)

die() { echo "gpu_check: FAILED: $*" >&2; echo "gpu_check: FAIL"; exit 1; }
from_wheels() {  # install packages from the prepared wheel directory only (no index)
  [ -n "$WHEELS" ] && [ -d "$WHEELS" ] || return 1
  $PY -m pip install -q --no-index --find-links "$WHEELS" "$@"
}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

# 1. a torch that sees CUDA (probe:cuda)
if ! $PY -c "# probe:cuda
import torch, sys
sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: torch sees no CUDA device; installing a CUDA build of torch"
  $PY -m pip install -q --upgrade torch || die "could not install a CUDA build of torch"
  $PY -c "# probe:cuda
import torch, sys
sys.exit(0 if torch.cuda.is_available() else 1)" || die "torch still sees no CUDA device"
fi

# 2. packtool with its test and verify dependencies
$PY -c "import packtool, pytest, transformers" 2>/dev/null \
  || $PY -m pip install -q -e ".[dev,verify]" || die "could not install packtool[dev,verify]"

# 3. flash-attn: install if missing; it must import, or the check fails here (probe:flash)
if ! $PY -c "# probe:flash
from flash_attn import flash_attn_varlen_func" 2>/dev/null; then
  echo "gpu_check: installing flash-attn (from ${WHEELS:-the package index})"
  if [ -n "$WHEELS" ]; then
    from_wheels flash-attn \
      || die "flash-attn could not be installed from $WHEELS; the flash backend cannot be checked"
  else
    $PY -m pip install -q flash-attn --no-build-isolation \
      || die "flash-attn could not be installed; the flash backend cannot be checked"
  fi
  $PY -c "# probe:flash
from flash_attn import flash_attn_varlen_func" \
    || die "flash-attn is installed but cannot be imported (see the error above)"
fi

# 4. causal-conv1d and mamba-ssm, from prebuilt wheels only (probe:mamba)
if ! $PY -c "# probe:mamba
from causal_conv1d import causal_conv1d_fn
from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined" 2>/dev/null; then
  [ -n "$WHEELS" ] || die "causal-conv1d and mamba-ssm are not installed and GPU_CHECK_WHEELS \
names no wheel directory; make one with scripts/gpu_wheels.sh on a machine with the index"
  echo "gpu_check: installing causal-conv1d and mamba-ssm from $WHEELS"
  from_wheels causal-conv1d mamba-ssm \
    || die "causal-conv1d and mamba-ssm could not be installed from $WHEELS; the mamba backend cannot be checked"
  $PY -c "# probe:mamba
from causal_conv1d import causal_conv1d_fn
from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined" \
    || die "causal-conv1d / mamba-ssm are installed but cannot be imported (see the error above)"
fi
$PY -c "import torch; print('gpu_check: torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"

# one line per backend, from a verify report: PASS only when the backend ran every check and
# passed
cat > "$OUT/lines.py" <<'EOF'
import json, sys
path, label, backends = sys.argv[1], sys.argv[2], sys.argv[3:]
try:
    rep = json.load(open(path))
except Exception as exc:
    print(f"gpu_check: {label}: no verify report ({exc})")
    sys.exit(1)
bad = False
for b in backends:
    res = [r for r in rep["results"] if r["backend"] == b]
    fails = [r for r in res if r["status"] != "pass" and r.get("required", True)]
    ran = any(r["status"] == "pass" and r["check"] == "logits_match" for r in res)
    lm = next((r for r in res if r["check"] == "logits_match"), {})
    figs = lm.get("figures", {})
    if ran and not fails:
        print(f"gpu_check: {label:5} {b:7} PASS  {lm.get('device', '')} {lm.get('dtype', '')}  "
              f"max_abs_diff={figs.get('max_abs_diff', 0):.3g} tol={figs.get('tol', 0):.3g}  "
              f"{figs.get('seconds', '?')} s")
    else:
        bad = True
        why = "; ".join(f"{r['check']}: {r['status']} {r.get('message', '')}" for r in fails)
        print(f"gpu_check: {label:5} {b:7} FAIL  {why or 'did not run'}")
for p in rep.get("problems", []):
    print(f"gpu_check:   - {p}")
sys.exit(1 if bad or not rep.get("ok") else 0)
EOF

# 5. pack the sample data (plain, and with --segment-multiple) and verify every backend on CUDA;
#    every backend is requested, so a skipped one makes verify exit non-zero
rc=0
args=()
for b in "${BACKENDS[@]}"; do args+=(--backend "$b"); done
for layout in plain cp; do
  extra=()
  [ "$layout" = cp ] && extra=(--segment-multiple "$MULTIPLE")
  $PY -m packtool pack --capacity "$CAPACITY" --quiet --overwrite ${extra[@]+"${extra[@]}"} "$DATA" \
    "$OUT/$layout" || die "packtool pack ${extra[*]+${extra[*]}} failed"
  $PY -m packtool verify "$OUT/$layout" --rows "$ROWS" --device cuda --compile "${args[@]}" \
    --json --no-progress > "$OUT/$layout.json" 2> "$OUT/$layout.err" || rc=1
  $PY "$OUT/lines.py" "$OUT/$layout.json" "$layout" "${BACKENDS[@]}" || rc=1
  [ -s "$OUT/$layout.err" ] && [ "$rc" != 0 ] && tail -5 "$OUT/$layout.err"
done

# 6. the GPU tests
if [ "${GPU_CHECK_TESTS:-1}" != 0 ]; then
  $PY -m pytest -q -p no:cacheprovider -m gpu tests/verify || rc=1
fi

if [ "$rc" = 0 ]; then echo "gpu_check: OK"; else echo "gpu_check: FAIL"; fi
exit $rc
