"""The atlas's coherence column: C(T) with its interval, replicates, T and reading from the verdict's
``coherence``; the reason when not measurable; ``-`` when the pair recorded none."""

from divergence.atlas.catalog import OPTIMIZATIONS
from divergence.atlas.render import COLUMNS, cells
from divergence.atlas.rows import measured_row

COLUMN = COLUMNS.index("coherence C(T) [95% CI] (n) reading")


def summary(coherence):
    verdict = {"study": "p", "status": "bounded", "dose_ratio": {"log10": -0.4}, "outcome": {}, "coherence": coherence}
    return {"verdicts": [verdict], "pairs": {}}


def test_the_column_states_c_its_interval_and_reading_or_why_not():
    measured = {"C": 1.013, "lo": 0.981, "hi": 1.046, "cos": 0.01, "replicates": 6, "steps": 10, "reading": "wanders"}
    row = measured_row(OPTIMIZATIONS["flash"], "unet", "p", summary({**measured, "per_replicate": [{"C": 1.0}]}), "r")
    assert "per_replicate" not in row["coherence"]  # the atlas keeps the pooled numbers only
    assert cells(row)[COLUMN] == "1.01 [0.98, 1.05] (6) T=10 wanders" and len(cells(row)) == len(COLUMNS)
    why = "not measurable: the arms differ in train.adamw_impl, which cannot be switched on one model"
    row = measured_row(OPTIMIZATIONS["fused-adamw"], "unet", "p", summary({"reading": why, "replicates": 6}), "r")
    assert cells(row)[COLUMN] == why
    assert cells(measured_row(OPTIMIZATIONS["flash"], "unet", "p", summary(None), "r"))[COLUMN] == "-"
