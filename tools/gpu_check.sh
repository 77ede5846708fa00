#!/usr/bin/env bash
# The GPU check (`make gpu-check`): on a machine with a CUDA device, runs the tests marked gpu,
# the codec benchmark on the device, the DDP hook benchmark on one GPU and the simulated-ranks
# equality (CUDA tensors against CPU tensors, bit for bit), printing the card, the torch and
# CUDA versions and every figure. 2^24 coordinates per codec, mlp-4096 (36.8M parameters) with
# 3 warm-up + 20 timed steps per hook. On one H200 (2026-11-30) its stages, run by hand after
# compiling the numba kernels in 16 parallel processes (60-70 s), took: the gpu tests 133 s (69 s
# with 8 pytest-xdist workers), the codecs 17 s, the hooks 47-57 s, the simulated ranks 18 s;
# this script, which compiles as it goes, has not been timed there.
# Exits non-zero on any failure, and at once, saying why, where there is no CUDA device or
# gradzip is not installed for the interpreter.
#
# PYTHON names the interpreter (default: python3 on the PATH): one whose torch is a CUDA build
# already, with gradzip installed without letting pip resolve torch (a plain install could
# fetch another torch):
#   pip install --no-deps -e . && pip install numpy numba constriction zlib-ng matplotlib pytest hypothesis
# Not `make setup`'s .venv: its torch is the CPU build the CPU-only machines pin.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

"$PYTHON" - <<'PY'
import sys

try:
    import torch
except ImportError:
    sys.exit(f"gpu-check: torch is not installed for {sys.executable} (PYTHON names the interpreter)")

if not torch.cuda.is_available():
    build = "a CPU build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    sys.exit(
        f"gpu-check: no CUDA device (torch {torch.__version__}, {build}, sees no GPU); "
        "this check needs an NVIDIA GPU and a CUDA build of torch (PYTHON names the interpreter)"
    )
try:
    import gradzip  # noqa: F401
    import pytest  # noqa: F401
except ImportError as err:
    sys.exit(
        f"gpu-check: {err.name} is not installed for {sys.executable}; beside its CUDA torch, "
        "without letting pip resolve torch: pip install --no-deps -e . && pip install numpy numba constriction zlib-ng matplotlib pytest hypothesis"
    )
print(f"gpu-check: {torch.cuda.get_device_name()} (of {torch.cuda.device_count()} device(s))")
print(f"gpu-check: torch {torch.__version__}, CUDA {torch.version.cuda}")
PY

stage() {
	echo
	echo "== gpu-check: $1 (at ${SECONDS} s)"
}

stage "pytest -m gpu"
"$PYTHON" -m pytest -m gpu -q -p no:cacheprovider
stage "codecs on the GPU"
"$PYTHON" -m gradzip bench codecs --device cuda --numel 16777216 --repeat 3 --threads 0
stage "DDP hooks on one GPU"
"$PYTHON" -m gradzip bench hook --device cuda --model mlp-4096 --warmup 3 --steps 20
stage "simulated ranks: CUDA tensors against CPU tensors"
"$PYTHON" -m gradzip bench sim-ranks --device cuda --world-size 4 --steps 3
echo
echo "gpu-check: passed in ${SECONDS} s"
