"""The verdict when the probe runs at a subset of the tracked steps (``tracking.probe.every``): the
window is read from the weights at every tracked step, so it and the dose ratio do not move; the
function-space twin is read at the probed steps of the window."""

import dataclasses

import numpy as np

from divergence.analysis import analyze
from tests.analysis.synthetic import dose_study

EVERY = 20


def thinned(pair, every=EVERY):
    """The pair as a run with ``tracking.probe.every = every`` would have written it."""
    due = (pair.steps % every == 0) | (pair.steps == pair.steps[-1])
    return dataclasses.replace(pair, probe={k: np.where(due, v, np.nan) for k, v in pair.probe.items()})


def test_sparse_probes_keep_the_window_and_the_verdict():
    pairs = dose_study(study=1e-6, precision=1e-3, horizon=400)
    dense, sparse = (analyze(p, n_boot=100).verdicts[0] for p in (pairs, [thinned(p) for p in pairs]))
    assert sparse.status == dense.status == "bounded"
    assert abs(sparse.dose.ratio.mean - dense.dose.ratio.mean) < 1e-12 and abs(sparse.dose.ratio.mean - (-3.0)) < 0.2
    for d, s in zip(dense.dose.estimates, sparse.dose.estimates):
        assert s.space == "function" and s.window == d.window
        # the twin: only the window's probed steps, so a value only when 5 of them fall inside it
        probed = np.isfinite(s.phi["reference"]) & s.in_window
        assert np.isfinite(s.log10_function) == (probed.sum() >= 5)
        if probed.sum() >= 5:
            assert abs(s.log10_function - (-3.0)) < 0.2
