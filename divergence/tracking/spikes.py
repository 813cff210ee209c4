"""Loss-spike rule: a loss above ``factor`` times the running median of the previous ``window``.

A median (not a mean) so one spike does not raise the bar for the next; the first ``window``
steps are never flagged, since there is no baseline yet. A non-finite loss is always a spike.
The state is a plain list, saved in the callback state so a resumed run flags exactly what an
uninterrupted one flags.
"""

from __future__ import annotations

import math
import statistics


class SpikeDetector:
    def __init__(self, factor: float, window: int):
        self.factor, self.window = factor, window
        self.history: list[float] = []

    def update(self, loss: float) -> bool:
        """Record ``loss``; return whether it is a spike."""
        if not math.isfinite(loss):
            return True
        spike = len(self.history) >= self.window and loss > self.factor * statistics.median(self.history)
        self.history = (self.history + [loss])[-self.window :]
        return spike

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.history = list(state.get("history", []))
