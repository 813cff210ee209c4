"""What a study's dose predicts for the finished model, read from a ``consequence.json``.

``divergence consequence`` measures, on one recipe, where the early dose (dex vs the precision
pair) stops leaving the converged score within the seed margin (its threshold) and whether early
dose ranks the converged shift at all (Spearman's rho with a cluster-bootstrap interval;
``analysis.consequence_curve``). A study's verdict on the same recipe (``recipe_id``: the
calibration's ``recipe_identity``, run length and seeds left out) then says what its dose predicts:

- the correlation's interval holds 0 (or there is none): the curve says early dose does not
  predict the finished model here, so the verdict says that, whatever the dose;
- the dose is at or below the highest rung that stayed within: expected within the seed margin at
  convergence (below the threshold);
- above the lowest rung that left it: the curve does not vouch for the finished model;
- between the two: the threshold's own interval, said as such.

Where the curve's sample distance (how far apart both arms' pictures from the same noises are) is
ranked by early dose with an interval above 0, the sentence adds what the finished models of the
curve's pair runs within ``NEAR_DEX`` of the dose drew: their distance as a fraction of a seed
change's (none near: said so).

Every sentence names the recipe and says it holds on that recipe only. A file for another recipe
gives a caveat instead.
"""

from __future__ import annotations

import math
from pathlib import Path

from divergence.analysis.consequence_curve import finite
from divergence.config.yaml_safe import short
from divergence.errors import UserInputError

CONSEQUENCE_FILE = "consequence.json"
REQUIRED = ("recipe", "recipe_id", "steps", "threshold", "spearman", "seed_margin", "sentence")
NEAR_DEX = 0.5  # the curve's pair runs this close to a study's dose say what its finished model draws


def check_consequence(data, path: Path) -> dict:
    """``data`` when it is a ``consequence.json`` with the keys a prediction reads; one line otherwise."""
    if not isinstance(data, dict):
        raise UserInputError(f"{path}: not a consequence.json (expected a JSON object)")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise UserInputError(
            f"{path}: not a consequence.json of this version (no {missing[0]}); write it again with divergence consequence"
        )
    if not isinstance(data["threshold"], dict) or not isinstance(data["spearman"], dict):
        raise UserInputError(f"{path}: threshold and spearman must be JSON objects")
    score = data["spearman"].get("score")
    if score is not None and not isinstance(score, dict):
        raise UserInputError(f"{path}: spearman.score must be a JSON object")
    numbers = {
        **{f"threshold.{k}": data["threshold"].get(k) for k in ("below_dex", "above_dex")},
        **{f"spearman.score.{k}": (score or {}).get(k) for k in ("rho", "lo", "hi")},
    }
    for key, value in numbers.items():
        if value is not None and not finite(value):
            raise UserInputError(f"{path}: {key} is {short(value)}; expected a finite number or null")
    if not isinstance(data["recipe_id"], str) or not finite(data["steps"]):
        raise UserInputError(f"{path}: recipe_id must be a string and steps a number")
    return data


def _object(value) -> dict:
    """``value`` when it is a JSON object, else an empty one (a part a prediction can do without)."""
    return value if isinstance(value, dict) else {}


def prediction(consequence: dict, dex: float, reference: str) -> str:
    """The sentence a verdict adds for a dose of ``dex`` (log10 vs ``reference``) on the curve's recipe."""
    return _score_prediction(consequence, dex, reference) + _pictures(consequence, dex)


def _pictures(consequence: dict, dex: float) -> str:
    """What the curve's pair runs near ``dex`` drew, as a fraction of a seed change's sample distance;
    "" where the curve has no sample distance that early dose ranks."""
    distance, rho = _object(consequence.get("sample_distance")), _object(consequence["spearman"].get("distance"))
    seed = distance.get("seed")
    if not finite(seed) or seed <= 0 or not all(finite(rho.get(k)) for k in ("rho", "lo", "hi")) or rho["lo"] <= 0:
        return ""
    near = [
        r["sample_distance"]["value"] / seed
        for r in consequence.get("runs") or []
        if isinstance(r, dict)
        and r.get("reference") != "seed"
        and finite(r.get("early_dex"))
        and abs(r["early_dex"] - dex) <= NEAR_DEX
        and finite(_object(r.get("sample_distance")).get("value"))
    ]
    ranked = f"early dose ranks that distance, Spearman rho {rho['rho']:+.2f} [{rho['lo']:+.2f}, {rho['hi']:+.2f}]"
    if not near:
        return (
            f" No pair run of the curve lies within {NEAR_DEX} dex of this dose to say what its pictures do ({ranked})."
        )
    span = f"{min(near):.2f}x" if len(near) == 1 else f"{min(near):.2f}x-{max(near):.2f}x"
    return (
        f" What it draws: the curve's {len(near)} pair run(s) within {NEAR_DEX} dex of this dose drew, from the same "
        f"noises, pictures {span} as far apart as a seed change's ({ranked})."
    )


def _score_prediction(consequence: dict, dex: float, reference: str) -> str:
    where = f"on this recipe only ({consequence['recipe']}, {consequence['steps']} steps)"
    rho = consequence["spearman"].get("score") or {}
    if rho.get("lo") is None or not rho["lo"] > 0:
        if rho.get("rho") is None:
            said = "no rank correlation could be read"
        elif rho.get("lo") is None or rho.get("hi") is None:
            said = f"Spearman rho {rho['rho']:+.2f}, without an interval"
        else:
            said = f"Spearman rho {rho['rho']:+.2f} [{rho['lo']:+.2f}, {rho['hi']:+.2f}]"
        return (
            f"What this dose means for the finished model's score is not known: the consequence curve found that "
            f"early dose does not predict the converged score ({said}), measured {where}."
        )
    below, above = consequence["threshold"].get("below_dex"), consequence["threshold"].get("above_dex")
    at = f"its dose, {dex:+.2f} dex vs {reference}"
    if below is not None and dex <= below:
        return (
            f"At convergence, doses up to {below:+.2f} dex left the score within the seed margin, and {at}, "
            f"is below that: its finished model is expected to draw as a seed change's would (measured {where})."
        )
    if above is not None and dex >= above:
        return (
            f"At convergence, a dose of {above:+.2f} dex already moved the score beyond the seed margin, and "
            f"{at}, is above that: the short run does not vouch for the finished model (measured {where})."
        )
    lower = "the lowest rung" if below is None else f"{below:+.2f}"
    upper = "the highest rung" if above is None else f"{above:+.2f}"
    return (
        f"At convergence, {at}, lies between {lower} and {upper} dex, where the consequence curve's threshold "
        f"lies: its finished model may or may not stay within the seed margin (measured {where})."
    )


def summary_of(consequence: dict | None) -> dict | None:
    """``summary.json``'s ``consequence``: the curve the predictions were read from."""
    if consequence is None:
        return None
    keep = ("recipe", "recipe_id", "steps", "threshold", "sentence", "source_file")
    out = {k: consequence.get(k) for k in keep}
    out["spearman"] = (consequence.get("spearman") or {}).get("score")
    out["spearman_distance"] = (consequence.get("spearman") or {}).get("distance")
    out["seed_distance"] = (consequence.get("sample_distance") or {}).get("seed")
    out["convergence"] = (consequence.get("convergence") or {}).get("sentence")
    out["seed_margin"] = ((consequence.get("seed_margin") or {}).get("score") or {}).get("value")
    if isinstance(out["seed_margin"], float) and not math.isfinite(out["seed_margin"]):
        out["seed_margin"] = None
    return out
