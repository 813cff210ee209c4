"""The one zygote the fork-server tests share (``test_child_start``, ``test_rank_fork``, the expert-parallel
pair of ``tests/models/test_expert_parallel.py``, ``tests/scaleout/test_separate_resume.py``): its
children's environment, and a ``sitecustomize`` on their path that logs every interpreter that starts.

A zygote costs a fresh interpreter's imports (~10 s of CPU); one serves them all as long as their
children's environments are equal (``training.child_start`` keys a zygote by them, and starting one of
another key closes the others), so each takes its children's environment from ``child_env`` over the
one folder of the session fixture ``zygote_root`` (``tests/conftest.py``), whose tests are one xdist group.
"""

import json
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
    """The ``sitecustomize``, and this process's environment as the zygote's children's start from it."""
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (root / "environ.json").write_text(json.dumps(dict(os.environ)))


def child_env(root: Path, mode: str, log_starts: bool = True) -> dict[str, str]:
    """The environment of a child of ``root``'s zygote (``mode``: ``DIVERGENCE_CHILD_START``);
    ``log_starts=False``: its start is not logged (a Popen child the zygote never serves). Built from
    the environment ``write_site`` kept, not the one of now: a test's in-process training may have
    set variables since, which would key another zygote."""
    # without the rank variables an earlier in-process launch left in this worker's environment (Lightning's
    # launcher sets MASTER_PORT and the rest in its own process): a stale MASTER_PORT would be bound twice
    dropped = {"PYTEST_CURRENT_TEST", "MASTER_ADDR", *RANK_VARIABLES}
    kept = json.loads((root / "environ.json").read_text())
    env = {k: v for k, v in kept.items() if k not in dropped}
    path = os.pathsep.join([str(ROOT), str(root / "site")])
    env = dict(env, PYTHONPATH=path, DIVERGENCE_CHILD_START=mode)
    return dict(env, RANK_FORK_STARTS=str(root / "starts.jsonl")) if log_starts else env
