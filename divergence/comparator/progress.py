"""What ``divergence watch`` shows while it follows a pair: a progress bar and the arms in one line."""

from __future__ import annotations

import sys

from divergence.pairfolder.schedule import PairSchedule


class Progress:
    """The steps stored of the pair's steps (tqdm, on stderr); the last one's two trajectory metrics,
    or what it waits for."""

    def __init__(self, pair: PairSchedule, done: int):
        from tqdm import tqdm

        self._bar = tqdm(
            total=_total(pair.max_steps, pair.stride),
            initial=done,
            desc=f"watch {pair.name}",
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def end_at(self, max_steps: int | None, stride: int) -> None:
        """The pair's length changed (an open pair ended, or an arm restarted after its end)."""
        self._bar.total = _total(max_steps, stride)
        self._bar.refresh()

    def restart_at(self, done: int) -> None:
        """The store was cut back to ``done`` steps (an arm restarted)."""
        self._bar.n = done
        self._bar.refresh()

    def stepped(self, step: int, record: dict) -> None:
        self._bar.update(1)
        if record["tracked"]:
            self._bar.set_postfix_str(
                f"step {step}: wasserstein {record['wasserstein']:.4g}, max_abs_diff {record['max_abs_diff']:.4g}",
                refresh=False,
            )

    def waiting(self, step: int, statuses: dict) -> None:
        self._bar.set_postfix_str(f"waiting for step {step} ({arms_line(statuses)})")

    def close(self) -> None:
        self._bar.close()


def _total(max_steps: int | None, stride: int) -> int | None:
    return None if max_steps is None else max_steps // stride + 1


def arms_line(statuses: dict) -> str:
    """``a: running at 12; b: not started``: each arm's state, last step and attempt."""
    return "; ".join(
        f"{arm}: not started"
        if s is None
        else f"{arm}: {s.state}"
        + (f" at {s.last_step}" if s.last_step is not None else "")
        + (f", attempt {s.attempt}" if s.attempt > 1 else "")
        for arm, s in statuses.items()
    )
