"""``DIR/<arm>/status.json``: where an arm trained as its own job stands, for the comparator.

Written atomically by the arm's global rank zero when training starts and when it ends (or
fails). Keys (a contract between the arm jobs and ``divergence watch``):

- ``arm``: ``a`` or ``b``; ``state``: ``running``, ``finished`` or ``failed``;
- ``attempt``: 1 for the first start, +1 at every restart (a requeued or resumed job);
- ``start_step``: the global step this attempt started from (0, or the resumed checkpoint's);
  files of later steps left by an earlier attempt were removed before this was written;
- ``last_step``: the last completed step when the attempt ended (null while running);
- ``checkpoint_step``: the step of the arm's newest resumable checkpoint, where a restart would
  resume from (its writer says so: ``ArmWriter.checkpointed``, the Lightning callbacks on each
  save; the attempt's ``start_step`` until then, and when absent).
  ``divergence watch`` with ``tracking.keep`` deletes no weights file after it (``restart_point``);
- ``max_steps``, ``world_size``: the arm's length and its number of ranks;
- ``global_batch``: examples per optimizer step, ``batch_size x world_size x accumulate``; both
  arms must train on the same global batch, or they see different examples (null from a writer
  not told it: then the world sizes must agree);
- ``tensor_order``: the arm's weight names in module order, the order in which the lockstep
  tracker stores a step's tensor records (checkpoint files sort their names).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from divergence.atomic import read_json
from divergence.pairfolder.folder import as_arm_folder
from divergence.tables import write_json

STATES = ("running", "finished", "failed")


@dataclass
class ArmStatus:
    arm: str
    state: str = "running"
    attempt: int = 1
    start_step: int = 0
    last_step: int | None = None
    checkpoint_step: int | None = None
    max_steps: int = 0
    world_size: int = 1
    global_batch: int | None = None
    tensor_order: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.state not in STATES:
            raise ValueError(f"arm state {self.state!r} is not one of {', '.join(STATES)}")

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    def write(self, arm_dir: str | Path) -> None:
        write_json(as_arm_folder(arm_dir).status, asdict(self))

    @classmethod
    def read(cls, arm_dir: str | Path) -> "ArmStatus | None":
        """The status, or None when the arm has not started (or its file is being replaced)."""
        data = read_json(as_arm_folder(arm_dir).status)
        if data is None:
            return None
        return cls(**{k: data[k] for k in data if k in cls.__dataclass_fields__})


def restart_point(status: "ArmStatus | None") -> int:
    """The earliest step arm ``status`` may restart from and recompute the steps after: a finished
    arm's last step, else its newest resumable checkpoint (its attempt's start until it says one);
    -1 for an arm not started."""
    if status is None:
        return -1
    if status.state == "finished" and status.last_step is not None:
        return status.last_step
    return status.start_step if status.checkpoint_step is None else status.checkpoint_step


def batch_mismatch(statuses: dict[str, "ArmStatus | None"]) -> str | None:
    """What keeps the arms' batches from being the same, in words; None when they agree.

    The global batch decides what an optimizer step trains on (``divergence.data.batches``);
    where an arm did not record it, the world sizes must agree.
    """
    known = {arm: s for arm, s in statuses.items() if s is not None}
    if len(known) < 2:
        return None
    key = "global_batch" if all(s.global_batch is not None for s in known.values()) else "world_size"
    if len({getattr(s, key) for s in known.values()}) == 1:
        return None
    what = "global batches" if key == "global_batch" else "world sizes"
    return f"different {what} (" + ", ".join(f"arm {arm}: {getattr(s, key)}" for arm, s in known.items()) + ")"
