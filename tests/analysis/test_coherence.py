"""The coherence reading over replicates: a biased error drifts, an unbiased one wanders, a pair
that cannot be switched says why; the thresholds are the named shares of docs/method.md."""

import math

from divergence.analysis.coherence import DRIFT_SHARE, WANDER_SHARE, at_steps, line, pair_coherence, reading
from divergence.report.inputs import load_pairs
from tests.analysis.coherence_records import coherence_extra
from tests.analysis.synthetic import write_dose_study


def study_runs(root, **kwargs):
    write_dose_study(root, replicates=3, horizon=60, seed=False, precision=None, control=None, **kwargs)
    return [p for p in load_pairs([root]) if p.category == "optimization"]


def test_a_biased_error_drifts_and_an_unbiased_one_wanders(tmp_path):
    biased = pair_coherence(study_runs(tmp_path / "biased", extra=coherence_extra(0.9)))
    unbiased = pair_coherence(study_runs(tmp_path / "unbiased", extra=coherence_extra(0.0)))
    t = biased["steps"]  # the stored steps that are multiples of 3: 9 of the dense schedule to 60
    assert t == unbiased["steps"] == 9 and biased["replicates"] == 3
    # C^2 = 1 + (T - 1) rho: rho = 0.9 at T = 9 gives C near 2.9; rho = 0 near 1
    assert biased["lo"] > line(t, DRIFT_SHARE) and biased["reading"] == "drifts"
    assert 2.5 < biased["C"] < 3.0 and biased["cos"] > 0.7
    assert unbiased["hi"] < line(t, WANDER_SHARE) and unbiased["reading"] == "wanders"
    assert abs(unbiased["C"] - 1) < 0.35 and abs(unbiased["cos"]) < 0.3
    assert set(biased["layers"]) == {"unet.down_blocks.0", "unet.up_blocks.0"}


def test_not_measurable_is_read_as_its_reason(tmp_path):
    why = "not measurable: the arms differ in model.seed, which cannot be switched on one model"
    c = pair_coherence(study_runs(tmp_path, extra=coherence_extra(0.0, status=why)))
    assert c == {"reading": why, "replicates": 3}


def test_the_reading_lines_and_undecided():
    assert line(1, DRIFT_SHARE) == 1.0 and math.isclose(line(9, 1.0), 3.0)
    assert reading(2.0, 1.0, 3.0, 9) == "undecided"  # the interval crosses both lines
    assert reading(2.5, None, None, 9) == "drifts"  # one replicate: the point, sqrt(1 + 8 / 2) = 2.24
    assert reading(float("nan"), None, None, 9) == "undecided"
    assert at_steps([(3, 1, 1.0), (6, 2, 1.3), (9, 3, 1.5)], 2) == 1.3  # a replicate read at a common T
