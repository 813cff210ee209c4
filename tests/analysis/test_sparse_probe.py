"""The verdict when the probe runs at a subset of the tracked steps (``tracking.probe.every``): the
window still ends before the first probed saturation, and the dose ratio and status do not move."""

import dataclasses

import numpy as np

from divergence.analysis import analyze
from divergence.analysis.dose import next_probed
from tests.analysis.synthetic import dose_study

EVERY = 20


def thinned(pair, every=EVERY):
    """The pair as a run with ``tracking.probe.every = every`` would have written it."""
    due = (pair.steps % every == 0) | (pair.steps == pair.steps[-1])
    return dataclasses.replace(pair, probe={k: np.where(due, v, np.nan) for k, v in pair.probe.items()})


def test_a_step_between_probes_takes_the_next_probes_phi():
    phi = np.array([np.nan, 0.01, np.nan, np.nan, 0.2, np.nan])
    assert np.array_equal(next_probed(phi), [0.01, 0.01, 0.2, 0.2, 0.2, np.nan], equal_nan=True)


def test_sparse_probes_keep_the_window_before_saturation_and_the_verdict():
    # phi_P = K_F * 1e-3 * exp(0.02 t) crosses 0.1 near t = ln(50) / 0.02 ~ 196, between probes 180 and 200
    pairs = dose_study(study=1e-6, precision=1e-3, horizon=400)
    dense, sparse = (analyze(p, n_boot=100).verdicts[0] for p in (pairs, [thinned(p) for p in pairs]))
    assert sparse.status == dense.status == "bounded"
    assert abs(sparse.dose.mean - dense.dose.mean) < 0.05 and abs(sparse.dose.mean - (-3.0)) < 0.2
    for d, s in zip(dense.estimates, sparse.estimates):
        assert s.space == "function" and s.window[1] <= d.window[1]
        probed = np.isfinite(s.phi["reference"]) & np.isfinite(s.phi["study"])
        crossed = probed & ((s.phi["reference"] >= 0.1) | (s.phi["study"] >= 0.1))
        # never at or past a saturated probe, nor between it and the probe before it
        assert crossed.any() and s.window[1] <= s.steps[crossed][0] - EVERY, (s.window, s.steps[crossed][0])
