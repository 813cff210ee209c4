"""The consequence curve's statistics on synthetic pair runs: the seed margin, the threshold between two
rungs, the rank correlation with its cluster bootstrap, and the sentence when it does not hold."""

import math

import pytest

from divergence.analysis.consequence_curve import curve, rungs, seed_margin, spearman, threshold


def run(pair, role, dex, shift, replicate=0, eps=None, reference=None, probe=0.0):
    return {
        "pair": pair,
        "role": role,
        "reference": reference,
        "eps": eps,
        "replicate": replicate,
        "early_dex": dex,
        "score_shift": {"value": shift, "lo": shift - 0.01, "hi": shift + 0.01},
        "probe_shift": probe,
    }


def ladder(shifts: dict[float, tuple[float, list[float]]]) -> list[dict]:
    """{eps: (early dex, [shift of each replicate])} as ladder pair runs."""
    return [
        run(f"grad-noise-{eps}", "ladder", dex, s, r, eps=eps)
        for eps, (dex, values) in shifts.items()
        for r, s in enumerate(values)
    ]


SEEDS = [
    run("seed-vs-seed", "reference", None, s, r, reference="seed", probe=p)
    for r, (s, p) in enumerate([(0.02, 0.01), (-0.02, -0.01), (0.0, 0.0)])
]


def test_seed_margin_is_the_seed_pairs_spread_about_0_and_one_replicate_stands_in_with_a_caveat():
    assert seed_margin([0.02, -0.02, 0.0])["value"] == pytest.approx(math.sqrt(0.0008 / 3))  # RMS x 1
    # a seed change's shift has no sign of its own: two of one sign are its size, not a small spread
    assert seed_margin([0.071, 0.034])["value"] == pytest.approx(math.sqrt((0.071**2 + 0.034**2) / 2))
    one = seed_margin([-0.03])
    assert one["value"] == pytest.approx(0.03) and "one seed replicate" in one["caveat"]
    assert math.isnan(seed_margin([None, math.nan])["value"])


def test_threshold_lies_between_the_last_rung_within_and_the_first_outside():
    rows = ladder(
        {1e-4: (-3.0, [0.01, -0.015]), 1e-2: (-1.0, [0.0, 0.019]), 1.0: (0.5, [0.05, 0.01]), 1e-3: (-2.0, [0.0, 0.0])}
    )
    ordered = rungs(rows, 0.02)
    assert [r["eps"] for r in ordered] == [1e-4, 1e-3, 1e-2, 1.0] and [r["within"] for r in ordered] == [
        True,
        True,
        True,
        False,
    ]
    assert threshold(ordered, 0.02) == {"below_dex": -1.0, "above_dex": 0.5, "within_again": []}


def test_threshold_says_when_even_the_lowest_rung_leaves_and_when_none_does_and_rungs_within_again():
    low = rungs(ladder({1e-4: (-3.0, [0.05]), 1e-2: (-1.0, [0.0])}), 0.02)
    assert threshold(low, 0.02) == {"below_dex": None, "above_dex": -3.0, "within_again": [1e-2]}
    none = rungs(ladder({1e-4: (-3.0, [0.0]), 1e-2: (-1.0, [0.01])}), 0.02)
    assert threshold(none, 0.02) == {"below_dex": -1.0, "above_dex": None, "within_again": []}
    assert threshold(none, math.nan) == {}


def test_spearman_of_a_monotone_curve_is_1_with_an_interval_above_0():
    rows = [
        run(f"g{k}", "ladder", k + 0.1 * r, 0.01 * (k + 5) + 0.001 * r, r, eps=10.0**k)
        for k in range(-4, 1)
        for r in (0, 1)
    ]
    c = spearman(rows + SEEDS)  # the seed pair is the margin, not a point
    assert c["rho"] == pytest.approx(1.0) and c["points"] == 10 and c["pairs"] == 5 and c["lo"] > 0


def test_spearman_of_shifts_unrelated_to_dose_holds_0_and_the_sentence_says_dose_does_not_predict():
    shifts = [0.03, -0.001, 0.02, 0.0, 0.025, 0.002]
    rows = ladder({10.0**k: (k, [shifts[k + 5]]) for k in range(-5, 1)})
    rows += [run("flash", "row", -2.5, 0.028), run("int8", "row", 0.3, 0.001)]
    result = curve(rows + SEEDS, "tiny", 2000)
    c = result["spearman"]["score"]
    assert c["lo"] < 0 < c["hi"] and c["pairs"] == 8
    assert "Early dose does not predict the converged outcome here" in result["sentence"]
    assert "Measured on this recipe only (tiny, 2000 steps)" in result["sentence"]
    # the threshold: 1e-5 (-5 dex) leaves the margin of 0.016 (the RMS of 0.02, -0.02, 0) already
    assert result["threshold"]["below_dex"] is None
    assert "Even the lowest ladder rung (-5.00 dex vs the precision pair)" in result["sentence"]
    assert result["seed_margin"]["probe"]["value"] == pytest.approx(math.sqrt(0.0002 / 3))


def test_too_few_or_tied_points_give_no_correlation_and_say_why():
    assert spearman(ladder({1e-3: (-2.0, [0.01]), 1e-1: (-0.2, [0.02])}))["rho"] is None  # 2 points
    tied = curve(ladder({1e-3: (-2.0, [0.0]), 1e-2: (-1.0, [0.0]), 1e-1: (-0.2, [0.0])}) + SEEDS, "tiny", 10)
    assert tied["spearman"]["score"]["why"] == "constant" and "no rank correlation to read" in tied["sentence"]


def test_a_pair_run_without_an_early_dose_is_named_not_dropped_in_silence():
    rows = ladder({1e-3: (-2.0, [0.0]), 1e-2: (-1.0, [0.01]), 1.0: (None, [0.3])}) + SEEDS
    result = curve(rows, "tiny", 10)
    assert result["left_out"] == ["grad-noise-1.0#0"] and [r["eps"] for r in result["ladder"]] == [1e-3, 1e-2]
    assert result["sentence"].startswith("1 pair run(s) had no early dose") and "grad-noise-1.0#0" in result["sentence"]


def with_distance(rows: list[dict], distances: dict[str, float]) -> list[dict]:
    """The rows with a sample distance per pair (the same for its replicates)."""
    return [{**r, "sample_distance": {"value": distances[r["pair"]], "lo": 0.0, "hi": 1.0}} for r in rows]


def test_a_sample_distance_ranked_by_dose_is_said_beside_a_score_it_does_not_rank():
    """Shifts that do not follow the dose, pictures that do: the score says no prediction, the distance one."""
    rows = ladder({1e-3: (-2.0, [0.01, -0.01]), 1e-2: (-1.0, [-0.02, 0.0]), 1e-1: (-0.2, [0.0, 0.01])}) + SEEDS
    distances = {"grad-noise-0.001": 0.01, "grad-noise-0.01": 0.03, "grad-noise-0.1": 0.08, "seed-vs-seed": 0.1}
    result = curve(with_distance(rows, distances), "tiny", 10)
    assert result["spearman"]["distance"]["rho"] == pytest.approx(1.0) and result["spearman"]["distance"]["lo"] > 0
    assert result["sample_distance"] == {
        "seed": pytest.approx(0.1),
        "replicates": 3,
        "ratios": pytest.approx([0.1, 0.8]),
    }
    assert "Early dose does not predict the converged outcome here" in result["sentence"]
    assert "moved by 0.10x to 0.80x a seed change's sample distance (0.100)" in result["sentence"]
    assert "early dose predicts how far the finished model's pictures move" in result["sentence"]
    assert result["sentence"].endswith("another recipe needs its own curve.")


def test_without_sample_distances_the_curve_says_nothing_of_them():
    result = curve(ladder({1e-3: (-2.0, [0.0]), 1e-2: (-1.0, [0.01]), 1e-1: (-0.2, [0.02])}) + SEEDS, "tiny", 10)
    assert result["sample_distance"] is None and "distance" not in result["spearman"]
    assert "sample distance" not in result["sentence"]
