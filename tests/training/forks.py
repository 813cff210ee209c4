"""The one zygote the fork tests share (``test_child_start``, ``test_rank_fork``): its children's
environment, and a ``sitecustomize`` on their path that logs every interpreter that starts.

A zygote costs a fresh interpreter's imports (~9 s of CPU); one serves both modules as long as
their children's environments are equal (``training.child_start`` keys a zygote by them), so both
take theirs from ``child_env`` over the one folder of the session fixture ``zygote_root``.
"""

import os
from pathlib import Path

from divergence.training.separate_pair import RANK_VARIABLES

ROOT = Path(__file__).resolve().parents[2]
# Run at every interpreter's start (never in a forked child): its pid and argv.
SITECUSTOMIZE = """
import json, os, sys
_starts = os.environ.get("RANK_FORK_STARTS")
if _starts:
    with open(_starts, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "argv": sys.orig_argv}) + "\\n")
"""


def write_site(root: Path) -> None:
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)


def child_env(root: Path, mode: str, log_starts: bool = True) -> dict[str, str]:
    """The environment of a child of ``root``'s zygote (``mode``: ``DIVERGENCE_CHILD_START``);
    ``log_starts=False``: its start is not logged (a Popen child the zygote never serves)."""
    # without the rank variables an earlier in-process launch left in this worker's environment (Lightning's
    # launcher sets MASTER_PORT and the rest in its own process): a stale MASTER_PORT would be bound twice
    dropped = {"PYTEST_CURRENT_TEST", "MASTER_ADDR", *RANK_VARIABLES}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    path = os.pathsep.join([str(ROOT), str(root / "site")])
    env = dict(env, PYTHONPATH=path, DIVERGENCE_CHILD_START=mode)
    return dict(env, RANK_FORK_STARTS=str(root / "starts.jsonl")) if log_starts else env
