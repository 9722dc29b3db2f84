"""Where tensors live: `run.device` (cpu | cuda), checked before anything is loaded.

`resolve_device("cuda")` on a machine without a usable CUDA device is an error that says
which: a CPU-only build of torch, or no visible device. specrl never falls back to the CPU
silently: a run that asked for a GPU and got a CPU would be a hundred times slower.
"""
from __future__ import annotations

import torch

DEVICES = ("cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    if name not in DEVICES:
        raise ValueError(f"device {name!r}: choose one of {list(DEVICES)}")
    if name == "cuda" and not torch.cuda.is_available():
        why = (f"this torch ({torch.__version__}) is a CPU-only build" if torch.version.cuda is None
               else "no CUDA device is visible (check the driver and CUDA_VISIBLE_DEVICES)")
        raise ValueError(f"run.device=cuda, but {why}: install a CUDA build of torch on a GPU machine, "
                         "or set run.device=cpu")
    return torch.device(name)
