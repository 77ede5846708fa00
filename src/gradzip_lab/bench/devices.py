"""Which device a benchmark runs on, and the clear refusal where that device is missing."""

from __future__ import annotations

import torch

#: the ``--device`` choices of the device benchmarks
DEVICES = ("cpu", "cuda")


def missing_device(device: str) -> str | None:
    """Why ``device`` cannot be used here (a sentence naming the problem), or None if it can."""
    if device != "cuda" or torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return (
            f"--device cuda: no CUDA device: this torch ({torch.__version__}) is a CPU build; "
            "run it on a machine with an NVIDIA GPU and a CUDA build of torch"
        )
    return (
        f"--device cuda: no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) "
        "sees no GPU (torch.cuda.is_available() is False)"
    )


def device_name(device: torch.device) -> str:
    """The device as a reader knows it: the card's name on CUDA, ``cpu`` otherwise."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def resolve(device: str) -> torch.device:
    """``device`` as a torch device; CUDA gets its index (the current device) so that
    synchronization and DDP's ``device_ids`` name one card."""
    if device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device)
