"""divergence: measure and bound how far a training optimization moves a model's weights.

The package follows the data flow of a study::

    recipe -> models and variants -> training (one arm or a pair)
           -> checkpoints and metrics store -> metrics -> loggers and report

``divergence.metrics`` holds the pure tensor functions everything else is built on.

The Python API (see "Python API" in the README)::

    import divergence
    result = divergence.compare_state_dicts(model_a.state_dict(), model_b.state_dict())
    writer = divergence.ArmWriter("runs/pair", "a", max_steps=1000)     # one arm of your own loop
    divergence.watch("runs/pair")                                       # beside the two arm jobs
    pair = divergence.Pair("runs/pair", model_a, model_b, max_steps=1000)  # both arms in one loop
    pairs = divergence.load_pairs(["runs/pair"]); divergence.build_report(["runs/pair"], "report")

Importing ``divergence`` loads nothing heavy: each name is imported on first use.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from divergence.errors import CheckpointError, UserInputError
from divergence.import_noise import silence_import_noise

silence_import_noise()  # torchao's CPU-build kernel warnings and kin (logging filters only)

__version__ = "0.1.0"

# public name -> the module that defines it; imported on first access (PEP 562)
_LAZY = {
    # comparing two models' weights
    "compare_state_dicts": "divergence.checkpoints.compare",
    "compare_checkpoints": "divergence.checkpoints.compare",
    "Comparison": "divergence.checkpoints.compare",
    # the metric functions (pure functions of two tensors)
    "wasserstein": "divergence.metrics",
    "max_abs_diff": "divergence.metrics",
    "mean_abs_diff": "divergence.metrics",
    "rms_diff": "divergence.metrics",
    "rel_l2": "divergence.metrics",
    "cosine": "divergence.metrics",
    "compare_tensors": "divergence.metrics",
    "METRICS": "divergence.metrics",
    # writing a pair folder from your own training
    "ArmWriter": "divergence.writers",
    "Pair": "divergence.writers.pair",
    "watch": "divergence.cli.watch",
    # reading pair folders, analysing them, reporting
    "MetricsStore": "divergence.store",
    "PairInfo": "divergence.pairfolder.pair_json",
    "find_runs": "divergence.report.inputs",
    "load_pair": "divergence.report.inputs",
    "load_pairs": "divergence.report.inputs",
    "analyze": "divergence.analysis",
    "build_report": "divergence.report.build",
    # bug or noise: a change against a reordering of the baseline's sums
    "one_step_check": "divergence.analysis.one_step",
    "trajectory_check": "divergence.analysis.trajectory_check",
}

__all__ = ["CheckpointError", "UserInputError", "__version__", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(
            f"module 'divergence' has no attribute {name!r} (divergence was imported from "
            f"{Path(__file__).parent}; is a folder named 'divergence' shadowing the installed package?)"
        )
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
