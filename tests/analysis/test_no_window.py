"""The no-window reason names what it measured; pairs that all start from the same weights are a fine-tune.

The issue's fine-tuning measurements (E at step 1): 1.2e-9 for fused vs foreach AdamW, 6.7e-4
for bf16 vs fp32, 4.4e-3 for a data-order seed pair that, like the others, starts at E = 0. The
precision pair is then 0.15 of the seed pair's level at step 1: read with the from-scratch rule
(saturated at 0.1) no tracking could give a window. Every pair's arms start equal, so the pairs
are read as a fine-tune (``analysis.finetune``), whose ceiling is 0.5 of the data-order pair's.
"""

from tests.byo.test_pair_names import verdicts, write_pair


def test_same_start_pairs_are_read_as_a_finetune_and_get_a_verdict(tmp_path):
    root = tmp_path / "study"
    for r in range(2):
        for name, category, eps in (
            ("fused-vs-foreach", "optimization", 1.2e-6),  # 1.2e-9 sits under fp32's resolution of the weights
            ("bf16-vs-fp32", "precision", 6.7e-4),
            ("data-order", "seed", 4.4e-3),
        ):
            write_pair(root / f"{name}-r{r}", name, category, eps, r)
    (verdict,) = verdicts(root)
    headline = verdict["headline"]
    assert headline.startswith("Bounded: fused-vs-foreach perturbs training"), headline
    assert "log10 dose ratio -2.75" in headline  # log10(1.2e-6 / 6.7e-4): E_X / E_P at every step
    assert verdict["caveats"][0].startswith("a fine-tune (recognized from equal step-0 weights)")


def test_saturation_after_untracked_steps_says_which_steps_to_track(tmp_path):
    """Tracked every 5th step only: E_P = 0.05 e^(t/20) is 0.09 of E_S (about 0.72) at step 5 and
    0.11 at step 10, so one tracked step precedes saturation, where tracking steps 1 to 10 gives nine."""
    root = tmp_path / "study"
    for r in range(2):
        for name, category, eps in (
            ("flash", "optimization", 1e-4),
            ("bf16", "precision", 0.05),
            ("seed", "seed", None),
        ):
            write_pair(root / f"{name}-r{r}", name, category, eps, r, every=5, dense=[])
    (verdict,) = verdicts(root)
    assert (
        "saturated before the window: a pair's difference reaches 0.1 of the seed pair's at step 10"
        in (verdict["headline"])
    ), verdict["headline"]
    assert "track earlier and densely (every step from step 1 to step 10)" in verdict["headline"]
