"""When the step ``divergence watch`` waits for can never come, say so (exit 2) instead of waiting.

``watch`` waits for step N while an arm may still write it. It cannot when:

- an arm has ended (``finished`` or ``failed`` in its ``status.json``) before step N: the run
  stopped before ``max_steps`` (a crash, a Trainer whose epochs ran out first, a writer that
  ended early);
- an arm has ended after step N but holds no loss of step N, or no weights file of a tracked
  step N: a gap (a writer that skipped steps, a restart that did not say where it resumed
  from, files removed by hand). A weights file that is there but not complete yet (being
  copied in, or filled in place) is waited for: it may still become complete;
- an arm is ``running`` by its ``status.json`` but no process holds its ``writer.lock`` (the
  liveness rule: its writer was killed, ``kill -9`` too, or its machine went down; the OS drops a
  dead holder's lock), so it writes nothing more (``divergence.pairfolder.arm.lock.writer_alive``);
- the folder has no arm folders at all but a store of steps: a pair written in one process
  (``LockstepPair``, ``divergence train`` of a pair) or by ``divergence track``; there is nothing
  to follow (a complete one is simply done).

An arm's status is written after its last records, so once it reads ``finished`` or ``failed``
every loss and weights file it will ever write is there: the verdict cannot be premature. An
arm still ``running`` with its lock held (or restarted: a new ``attempt``) is waited for, as
before, and so is one whose writer takes no lock (no ``writer.lock`` file). When several arms
stop the pair, one that failed or died is named before one that finished. A restarting
arm cuts its old records before it writes its new status, so the comparator acts on a stall
only when two looks in a row find it with the same statuses (``Planner._stalled``).
"""

from __future__ import annotations

from pathlib import Path

from divergence.pairfolder.folder import PairFolder, as_pair_folder
from divergence.pairfolder.arm.lock import writer_alive
from divergence.pairfolder.layout import (
    ARMS,
    CHECKPOINTS_DIR,
    DCP_SUFFIX,
    LOSSES_FILE,
    STATUS_FILE,
    WRITER_LOCK_FILE,
    weights_dcp_name,
    weights_name,
)

ENDED = ("finished", "failed")


def stall(pair_folder: PairFolder | Path, step: int, pair, statuses: dict, feeds: dict) -> str | None:
    """Why step ``step`` of the pair in ``pair_folder`` will never be written, in one line; None while it may be.

    ``pair``: the ``PairSchedule``; ``statuses``/``feeds``: each arm's ``ArmStatus`` (or None)
    and ``ArmFeed``, read in that order (statuses first: an ended arm's files are all there). An arm
    that failed or died is named before one that finished: it is the one to restart.
    """
    found = []
    for arm in ARMS:
        status = statuses.get(arm)
        if status is None:
            continue
        if status.state in ENDED:
            why = _missing(arm, status, step, pair, feeds[arm])
        else:
            why = _dead(arm, status, feeds[arm])
        if why is not None:
            found.append((status.state == "finished", why))
    if not found:
        return None
    _, why = min(found, key=lambda item: item[0])
    return (
        f"{why}; the pair cannot be completed as it is. Restart the arm (from its checkpoint, saying where "
        "it resumes), then run watch again: it continues from its store"
    )


def _dead(arm: str, status, feed) -> str | None:
    """A ``running`` arm whose ``writer.lock`` no process holds has died (killed, its node lost):
    it writes nothing more. An arm whose writer takes no lock (no lock file) is waited for."""
    if writer_alive(feed.arm_folder) is not False:
        return None
    since = f"attempt {status.attempt}, from step {status.start_step}"
    return (
        f"arm {arm} died: its {arm}/{STATUS_FILE} says running ({since}) but no process holds "
        f"{arm}/{WRITER_LOCK_FILE} (its writer was killed, or its machine went down)"
    )


def _missing(arm: str, status, step: int, pair, feed) -> str | None:
    last = status.last_step
    ended = f"arm {arm} {status.state} at step {last}"
    if last is None or step > last:
        known = pair.max_steps is not None and step <= pair.max_steps
        return f"{ended}, before step {step}" + (f" (max_steps {pair.max_steps})" if known else "")
    if step > 0 and step not in feed.loss_file.read_new():
        return f"{ended}, but its {arm}/{LOSSES_FILE} has no step {step} (a gap)"
    if pair.tracked(step) and not feed.arm_folder.saved_weights(step).exists():
        return f"{ended}, but it has no {arm}/{CHECKPOINTS_DIR}/{_weights_name(feed.arm_folder, step)} (tracked step {step})"
    return None


def _weights_name(arm_folder, step: int) -> str:
    """The name of the weights of ``step`` an arm writes: its DCP folder's when the arm holds DCP
    folders (``ArmWriter(..., format="dcp")``), else its safetensors file's."""
    try:
        dcp = any(p.is_dir() for p in arm_folder.checkpoints_dir.glob(f"step_*{DCP_SUFFIX}"))
    except OSError:
        dcp = False
    return f"{weights_dcp_name(step)}/" if dcp else weights_name(step)


def armless(pair_folder: PairFolder | Path) -> bool:
    """No arm folder in ``pair_folder``: a pair trained in one process or built by ``track``, if it has a store."""
    return not any(arm.path.is_dir() for arm in as_pair_folder(pair_folder).arms.values())
