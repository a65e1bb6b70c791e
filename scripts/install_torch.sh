#!/bin/sh
# Install torch into a virtual environment, choosing the build for this machine:
#
#   scripts/install_torch.sh PYTHON VERSION [BUILD] [INDEX]
#
# BUILD auto (default): cuda when an NVIDIA GPU answers `nvidia-smi -L`, else cpu.
#   cpu:  torch==VERSION+cpu, the CPU-only build (about 200 MB). A wheel pip can reach without
#         the network (a wheelhouse in pip's find-links) is used first; otherwise PyTorch's CPU
#         index is added as an extra index. The "+cpu" pin never resolves to a CUDA build.
#   cuda: torch==VERSION from the configured index (PyPI's Linux wheels are the CUDA build and
#         pull several GB of nvidia-* wheels).
# INDEX: an extra index to take torch from, e.g. https://download.pytorch.org/whl/cu128 for a
#   given CUDA version; then BUILD is not looked at.
set -eu
py=$1
version=$2
build=${3:-auto}
index=${4:-}
cpu_index=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}  # overridable: a mirror

if [ -n "$index" ]; then
    echo "==> torch $version from $index (and the configured index)"
    exec "$py" -m pip install --progress-bar on "torch==$version" --extra-index-url "$index"
fi
if [ "$build" = auto ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        build=cuda
    else
        build=cpu
    fi
fi
case $build in
cuda)
    echo "==> NVIDIA GPU: torch $version, default (CUDA) build from the configured index" \
         "(several GB)"
    exec "$py" -m pip install --progress-bar on "torch==$version"
    ;;
cpu)
    echo "==> no NVIDIA GPU (or TORCH_BUILD=cpu): torch $version+cpu, the CPU-only build"
    if "$py" -m pip install -q --no-index --no-deps "torch==$version+cpu" >/dev/null 2>&1; then
        echo "    found a local torch $version+cpu wheel; installing its dependencies"
        exec "$py" -m pip install --progress-bar on "torch==$version+cpu"
    fi
    echo "    from $cpu_index (about 200 MB)"
    if ! "$py" -m pip install --progress-bar on "torch==$version+cpu" \
            --extra-index-url "$cpu_index"; then
        echo "could not install torch $version+cpu from $cpu_index; give another index with" \
             "TORCH_INDEX=URL, or install torch into $py's environment yourself" >&2
        exit 1
    fi
    ;;
*)
    echo "TORCH_BUILD must be auto, cpu or cuda, not '$build'" >&2
    exit 2
    ;;
esac
