"""The report's Method section follows the constants the analysis decides by (``docs/method.md``):
change a threshold and the text changes with it; no threshold is retyped as a literal."""

import pytest

from divergence.analysis import dose, finetune, outcome, reordering, replicates, verdict, window
from divergence.report import content

# (module, constant, a value no other constant has, how the text writes that value)
THRESHOLDS = [
    (dose, "SATURATED_E", 0.37, "0.37 E_seed"),
    (dose, "SATURATED_PHI", 0.37, "phi >= 0.37 / 0.5"),
    (dose, "HALF_WAY", 0.63, "phi >= 0.1 / 0.63"),
    (dose, "MIN_WINDOW", 7, "window under 7 steps"),
    (window, "RATE_FACTOR", 3.0, "within a factor 3"),
    (window, "SETTLED_BAND", 0.07, "within 0.07 dex of its plateau"),
    (verdict, "MAX_DRIFT", 0.9, "drift above 0.9 dex"),
    (outcome, "LAST_FRACTION", 0.2, "last 20% of steps"),
    (outcome, "MARGIN_FACTOR", 0.25, "m = 0.25 x the seed pair's spread"),
    (outcome, "SATURATED_END", 0.8, "(phi >= 0.8)"),
    (outcome, "SATURATED_FACTOR", 1.5, "held to 1.5 x the seed spread"),
    (replicates, "CONFIDENCE", 0.9, "a 90% t interval"),
    (finetune, "SATURATED_FINETUNE", 0.45, "reaches 0.45 E_seed"),
    (reordering, "REORDERING_DEX", 1.3, "at most +1.3 dex"),
]


def text() -> str:
    return "\n".join(content.method()) + "\n" + content.log_e_caption()


@pytest.mark.parametrize("module, name, value, written", THRESHOLDS, ids=[t[1] for t in THRESHOLDS])
def test_the_method_text_follows_each_constant(monkeypatch, module, name, value, written):
    before = text()
    assert written not in before
    monkeypatch.setattr(module, name, value)
    after = text()
    assert written in after, f"{name} = {value}: the Method section does not say {written!r}"
    assert after != before


def test_the_method_text_states_the_current_values():
    """Today's values, as the paragraphs read them (a literal left behind would say the old one)."""
    said = text()
    for fragment in (
        f"{dose.SATURATED_E:g} E_seed",
        f"phi >= {dose.SATURATED_PHI:g} / {dose.HALF_WAY:g}",
        f"factor {window.RATE_FACTOR:g}",
        f"{window.SETTLED_BAND:g} dex",
        f"drift above {verdict.MAX_DRIFT:g} dex",
        f"last {outcome.LAST_FRACTION:.0%} of steps",
        f"m = {outcome.MARGIN_FACTOR:g} x",
        f"phi >= {outcome.SATURATED_END:g}",
        f"window under {dose.MIN_WINDOW} steps",
        f"reaches {finetune.SATURATED_FINETUNE:g} E_seed",
        f"at most +{reordering.REORDERING_DEX:g} dex",
        f"at least {dose.MIN_WINDOW} of them",
        "docs/method.md",
    ):
        assert fragment in said
