"""Determinism and TF32: the numerics switches of a run, set where it trains and checked.

A control pair (two identical arms) must stay exactly equal, and a study refuses a verdict when
it does not. On a CPU that holds by default; on a GPU it needs (PyTorch, "Reproducibility",
https://pytorch.org/docs/stable/notes/randomness.html; cuBLAS, "Results reproducibility"):

- ``torch.use_deterministic_algorithms(True)``: deterministic kernels everywhere (e.g. the
  backward of convolutions and of scatter/index ops), and an error from any op that has none;
- ``torch.backends.cudnn.benchmark = False`` (auto-tuning may pick a different convolution
  algorithm in each process) and ``cudnn.deterministic = True``;
- ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, a fixed cuBLAS workspace, read when cuBLAS starts, so it
  is set before the first CUDA matmul (and inherited by DDP's worker processes).

TF32 (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``) rounds
fp32 matmul and convolution inputs to 10 mantissa bits on Ampere and later GPUs. It is off for
the whole run, and an arm whose recipe says ``train.tf32: true`` (the ``tf32`` variant) turns it
on for its own step only (``arm_numerics``), so two arms in one process each get their own.
The flags are process-wide in PyTorch; both contexts restore what they found on exit.

``train.deterministic: true`` is what a pair needs (it is the default); ``false`` leaves
PyTorch's defaults (nondeterministic kernels allowed, cuDNN benchmark unchanged), which is
faster and makes the control pair measure the hardware's run-to-run floor instead of zero.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re

import torch

from divergence.errors import UserInputError

CUBLAS_VAR = "CUBLAS_WORKSPACE_CONFIG"
# The two settings cuBLAS documents as reproducible; PyTorch checks for exactly these.
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")
_NO_DETERMINISTIC = re.compile(r"^(\S+?)(?:\(\))? does not have a deterministic implementation")


def numerics_state() -> dict:
    """The process's current determinism and TF32 settings (what ``determinism`` sets)."""
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cublas_workspace": os.environ.get(CUBLAS_VAR),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
    }


@contextlib.contextmanager
def determinism(train):
    """Apply ``train.deterministic`` (and TF32 off) around a run's fit; restore the flags after.

    A kernel with no deterministic implementation becomes one ``UserInputError`` naming it.
    """
    before = numerics_state()
    if train.deterministic:
        _set_cublas_workspace()
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    _set_tf32_flags(False, False)
    try:
        yield
    except RuntimeError as err:
        explained = _explained(err)
        if explained is None:
            raise
        raise explained from None
    finally:
        torch.use_deterministic_algorithms(before["deterministic_algorithms"])
        torch.backends.cudnn.benchmark = before["cudnn_benchmark"]
        torch.backends.cudnn.deterministic = before["cudnn_deterministic"]
        _set_tf32_flags(before["tf32_matmul"], before["tf32_cudnn"])


@contextlib.contextmanager
def arm_numerics(train):
    """TF32 as this arm's recipe says (``train.tf32``), and its intra-op threads (``train.cpu_threads``)
    where they differ from the process's, for the duration of one of its steps."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    threads = torch.get_num_threads()
    _set_tf32_flags(train.tf32, train.tf32)
    if train.cpu_threads and train.cpu_threads != threads:  # arms of a pair that differ in threads (cpu-threads)
        torch.set_num_threads(train.cpu_threads)
    try:
        yield
    finally:
        _set_tf32_flags(*before)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def comparing_threads(train) -> None:
    """The comparator's intra-op threads: ``train.cpu_threads`` of the pair it follows (on a CPU;
    none set: torch's default). Its probe then runs its forwards as the lockstep job's would, and
    its job takes one core, as each of the study's pair jobs does."""
    if train.cpu_threads:
        torch.set_num_threads(train.cpu_threads)


def with_arm_numerics(step):
    """Decorate ``Arm.training_step``: run it under ``arm_numerics(self.recipe.train)``."""

    @functools.wraps(step)
    def wrapped(self, *args, **kwargs):
        with arm_numerics(self.recipe.train):
            return step(self, *args, **kwargs)

    wrapped.applies_arm_numerics = True  # what the tf32 variant's verify looks for
    return wrapped


def _set_cublas_workspace() -> None:
    value = os.environ.get(CUBLAS_VAR)
    if value is None:
        os.environ[CUBLAS_VAR] = CUBLAS_DETERMINISTIC[0]
    elif value not in CUBLAS_DETERMINISTIC:
        raise UserInputError(
            f"train.deterministic is true but the environment sets {CUBLAS_VAR}={value}, which "
            f"cuBLAS does not keep reproducible; unset it or set {CUBLAS_DETERMINISTIC[0]}, or set "
            "train.deterministic=false"
        )


def _set_tf32_flags(matmul: bool, cudnn: bool) -> None:
    # The legacy flags, not ``fp32_precision``: torch >= 2.9 refuses a mix of the two APIs, and
    # Lightning's CUDA accelerator reads the legacy ``get_float32_matmul_precision``.
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn


def _explained(err: RuntimeError) -> UserInputError | None:
    """PyTorch's error for an op without a deterministic kernel -> one line naming the op."""
    text = str(err)
    match = _NO_DETERMINISTIC.match(text.strip())
    if match:
        return UserInputError(
            f"{match.group(1)} has no deterministic implementation on this device, and "
            "train.deterministic is true; set train.deterministic=false (the control pair then "
            "measures this hardware's run-to-run floor instead of zero)"
        )
    if "CUBLAS_WORKSPACE_CONFIG" in text and "deterministic" in text.lower():
        return UserInputError(
            f"cuBLAS started before {CUBLAS_VAR} was set, so its matmuls are not reproducible; "
            f"start the command with {CUBLAS_VAR}={CUBLAS_DETERMINISTIC[0]} in the environment, "
            "or set train.deterministic=false"
        )
    return None
