"""The process's global random state, saved and restored: how two arms draw the same randomness.

An arm's ``training_step`` may draw from the global generators (diffusion noise and
timesteps from ``torch.randn``, dropout masks, ``numpy.random``, ``random``). Restoring the
state saved before arm a's step, before arm b's step, gives b exactly a's draws, so a control
pair (two copies of one module) stays bitwise identical and any difference between the arms
is the one under study. CUDA generators are included only when CUDA is already initialized
(no CUDA query of ours initializes it).
"""

from __future__ import annotations

import random

import numpy as np
import torch


def rng_state() -> dict:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return {"torch": torch.get_rng_state(), "cuda": cuda, "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None:
        torch.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
