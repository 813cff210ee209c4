"""The window reads every replicate alike: past the first-steps transient, found from the data, from one
first step common to the replicates, each replicate on its own plateau (docs/method.md, "The unsaturated
window")."""

import dataclasses

import numpy as np
import pytest

from divergence.analysis import analyze, to_summary
from divergence.analysis.window import settle_step
from tests.analysis.synthetic import dose_study

# each replicate's plateau of log10(E_X/E_P) and the early level it holds to step ~9 and leaves by ~14 (as the
# bf16 flash study: -0.04 over steps 1-8, then -0.17 from step 14); read alone, the first stretch where both
# pairs grow alike is the early level in replicates 0 and 2 (windows 1-8, 2-7) and the plateau in 1 (18-60)
PLATEAUS = (-0.2, -0.45, 0.0)
EARLY = (0.3, 0.25, 0.35)  # dex above the plateau before the transient
HORIZON = 60


def _level(replicate: int, steps: np.ndarray) -> np.ndarray:
    """log10 of X's extra factor: the early level, a quick move (steps ~10-13), then the plateau."""
    return PLATEAUS[replicate] + EARLY[replicate] / (1 + np.exp((steps - 11.5) / 0.7))


def _with_transient(p):
    if p.category != "optimization":
        return p
    factor = 10 ** _level(p.replicate, p.steps.astype(float))
    return dataclasses.replace(
        p, rel_l2=p.rel_l2 * factor, probe=p.probe | {"probe_rel_diff": p.probe["probe_rel_diff"] * factor}
    )


@pytest.fixture(scope="module")
def transient():
    pairs = [_with_transient(p) for p in dose_study(study=1e-5, precision=1e-5, replicates=3, horizon=HORIZON)]
    return pairs, analyze(pairs, n_boot=50)


def test_every_replicate_is_read_on_its_plateau_from_one_common_step_past_the_transient(transient):
    pairs, analysis = transient
    v = analysis.verdicts[0]
    t0 = {e.window_start for e in v.dose.estimates}
    assert len(t0) == 1 and 13 <= (t0 := t0.pop()) <= 18  # one first step, past the move at steps 10-13
    assert all(t0 <= e.window[0] <= t0 + 2 for e in v.dose.estimates)  # each from its first alike step on
    assert all(e.window[1] == HORIZON and e.usable for e in v.dose.estimates)
    for e in v.dose.estimates:  # its plateau: the median of its own log ratio well past the transient
        plateau = np.median(e.log_ratio[e.steps >= 20])
        assert e.log10 == pytest.approx(plateau, abs=0.03), (e.replicate, e.window)
    assert v.dose.ratio.mean == pytest.approx(
        np.mean([np.median(e.log_ratio[e.steps >= 20]) for e in v.dose.estimates]), abs=0.02
    )
    windows = ", ".join(f"{e.window[0]}-{e.window[1]}" for e in v.dose.estimates)
    assert (
        f"windows steps {windows}" in v.headline or f"window steps {v.dose.window[0]}-{HORIZON} in every" in v.headline
    )
    dose = to_summary(analysis)["verdicts"][0]
    assert dose["dose_ratio"]["common_start"] == t0
    assert {r["settled_at"] for r in dose["per_replicate"]} <= set(range(12, 19))


def test_a_replicate_read_alone_before_its_transient_would_read_its_early_level(transient):
    """Why a rule is needed: the first stretch where both pairs grow alike is the early level."""
    _, analysis = transient
    for e in analysis.verdicts[0].dose.estimates:
        early = np.median(e.log_ratio[(e.steps >= 1) & (e.steps <= 5)])
        assert early - e.log10 > 0.2  # the early level sits 0.25-0.35 dex above the plateau read


def test_a_ratio_that_keeps_moving_never_settles():
    steps = np.arange(0, 61)
    log_ratio = -3 + steps / 60  # 1 dex across the run: a drift, not a transient
    everywhere = np.ones(len(steps), dtype=bool)
    assert settle_step(steps, log_ratio, everywhere, everywhere, 1, 5) is None
    flat = np.full(len(steps), -3.0)
    assert settle_step(steps, flat, everywhere, everywhere, 1, 5) == 1
