"""``Task``: what rank 0 decided for one turn of ``divergence watch``, the record every rank shares.

Rank 0's ``Planner`` builds it from the arms' files (``comparator.planner``), ``Ranks.broadcast``
sends it to every rank, every rank compares its share of the step's two weights files from it
(``comparator.distributed.measure``), and rank 0 records the step from it and the measurement.
It holds plain data only (it is pickled to the other ranks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("step", "wait", "done", "stop")


@dataclass
class Task:
    """One turn of the loop: ``kind`` is one of ``KINDS``.

    ``step``: the step to record ("step"); ``tracked``: its weights are compared; ``losses``:
    ``{arm: loss}`` (None at step 0); ``paths``: ``{arm: weights file}``; ``taken``: each file's
    identity when found complete (``feeds.unchanged``); ``order``: the tensors' order (arm a's
    ``status.json``); ``message``, ``code``: why a "stop" stops and its exit code.
    """

    kind: str
    step: int = -1
    tracked: bool = False
    losses: dict | None = None
    paths: dict = field(default_factory=dict)
    taken: dict = field(default_factory=dict)
    order: list = field(default_factory=list)
    message: str = ""
    code: int = 0
