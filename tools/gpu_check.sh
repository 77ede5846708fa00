#!/usr/bin/env bash
# The GPU check (`make gpu-check`): on a machine with a CUDA device, runs the tests marked gpu,
# the codec benchmark on the device, the DDP hook benchmark on one GPU and the simulated-ranks
# equality (CUDA tensors against CPU tensors, bit for bit), printing the card, the torch and
# CUDA versions and every figure. Sized to finish in under 8 minutes on one H100: 2^24
# coordinates per codec, mlp-4096 (36.8M parameters) with 3 warm-up + 20 timed steps per hook.
# Exits non-zero on any failure, and at once, saying why, where there is no CUDA device.
#
# PYTHON names the interpreter (default: the project's .venv, else python3 on the PATH).
set -euo pipefail

cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
	if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

"$PYTHON" - <<'PY'
import sys

import torch

if not torch.cuda.is_available():
    build = "a CPU build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    sys.exit(
        f"gpu-check: no CUDA device (torch {torch.__version__}, {build}, sees no GPU); "
        "this check needs an NVIDIA GPU and a CUDA build of torch"
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
