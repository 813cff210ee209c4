"""``divergence check``: bug or noise, from the two code paths or the two runs a user already has.

``divergence check step CHANGE BASELINE --setup SETUP``: each a ``file.py:function``. ``SETUP()``
returns ``(model, batch)``; ``CHANGE`` and ``BASELINE`` are ``path(model, batch)``, each computing the
gradient (left in ``.grad``, or returned as ``{name: tensor}``) of one training step on the same weights
and batch. The difference is stated against the baseline's gradient with its sums reordered (the batch
split into micro-batches; ``--reordered FILE:FN`` gives that path instead, ``--update`` says the paths
return optimizer updates, which need it). ``divergence.analysis.one_step``.

``divergence check trajectory PAIR --reference REF``: a pair folder (arm a the change, arm b the
baseline) against a reordering pair (arm a the baseline with its sums reordered, arm b the baseline), both
written by ``ArmWriter``. ``divergence.analysis.trajectory_check``.

Exit status: 0 reordering-like, 1 beyond reordering, 3 inconclusive, 2 bad input (one line).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from divergence.cli import plain
from divergence.errors import UserInputError
from divergence.tables import json_safe

HELP = "bug or noise: a change's gradient, or a pair's run, against a reordering of the baseline's sums"
EXIT = {"reordering_like": 0, "beyond_reordering": 1, "inconclusive": 3, None: 3}


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("check", help=HELP, description=plain(__doc__.split("\n\n")[1]))
    p.add_argument("mode", choices=("step", "trajectory"), help="step: one step's gradients; trajectory: two pairs")
    p.add_argument("change", help="step: FILE.py:FUNCTION, the changed path; trajectory: the pair folder")
    p.add_argument("baseline", nargs="?", help="step: FILE.py:FUNCTION, the baseline path")
    p.add_argument("--setup", help="step: FILE.py:FUNCTION returning (model, batch)")
    p.add_argument("--reordered", action="append", help="step: FILE.py:FUNCTION, a reordered reference (repeatable)")
    p.add_argument("--update", action="store_true", help="step: the paths return optimizer updates")
    p.add_argument("--reference", help="trajectory: the reordering pair folder")
    p.add_argument("--json", help="write the full result here as JSON")
    return p


def load_function(spec: str, what: str):
    """``FILE.py:FUNCTION`` imported and checked callable, or a one-line error naming what is wrong;
    any exception the function raises becomes one line naming ``spec``."""
    import importlib.util

    file, sep, name = (spec or "").rpartition(":")
    if not sep or not file or not name:
        raise UserInputError(f"{what}: {spec!r}: give FILE.py:FUNCTION")
    path = Path(file)
    if not path.is_file():
        raise UserInputError(f"{what}: {file}: no such file")
    module_spec = importlib.util.spec_from_file_location(f"divergence_check_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:  # the user's file: its error in one line, not our traceback
        raise UserInputError(f"{what}: {file} failed to import: {type(err).__name__}: {err}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise UserInputError(f"{what}: {file} has no function {name!r}")

    def call(*args):
        try:
            return function(*args)
        except UserInputError:
            raise
        except Exception as err:
            raise UserInputError(f"{spec} raised {type(err).__name__}: {err}") from None

    return call


def run_step(args) -> tuple[str | None, dict, str]:
    from divergence.analysis.one_step import one_step_check

    if not args.baseline or not args.setup:
        raise UserInputError("check step: give CHANGE BASELINE (each FILE.py:FUNCTION) and --setup FILE.py:FUNCTION")
    setup = load_function(args.setup, "--setup")
    made = setup()
    if not isinstance(made, tuple) or len(made) != 2 or not hasattr(made[0], "named_parameters"):
        raise UserInputError(f"--setup {args.setup}: must return (model, batch), the model a torch.nn.Module")
    change = load_function(args.change, "CHANGE")
    baseline = load_function(args.baseline, "BASELINE")
    reordered = [load_function(s, "--reordered") for s in args.reordered or []] or None
    result = one_step_check(
        change, baseline, made[0], made[1], reordered=reordered, kind="update" if args.update else "gradient"
    )
    return result.status, result.to_dict(), result.line()


def run_trajectory(args) -> tuple[str | None, dict, str]:
    from divergence.analysis.trajectory_check import trajectory_check

    if not args.reference or args.baseline:
        raise UserInputError("check trajectory: give PAIR and --reference REORDERING_PAIR (two pair folders)")
    result = trajectory_check(args.change, args.reference)
    if result["status"] is None:
        return None, result, f"no reading: {result['reason']}"
    words = result["status"].replace("_", " ").replace("reordering like", "reordering-like")
    line = (
        f"{words} by step {result['decided_step']}: log10 E_X/E_R {result['log10_ratio']:+.2f} (median over "
        f"{result['steps']} steps, range {result['lo']:+.2f} to {result['hi']:+.2f}; d = +{result['threshold']:g})"
    )
    return result["status"], result, line


def run(args) -> int:
    import json

    status, result, line = (run_step if args.mode == "step" else run_trajectory)(args)
    print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(json_safe(result, str), indent=1) + "\n")  # strict JSON: "nan", "inf"
    return EXIT[status]
