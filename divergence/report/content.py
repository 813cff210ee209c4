"""What the report says, independent of format: tables of strings and paragraphs.

``document`` renders it as Markdown and HTML, so the two files never disagree.
Growth rates are shown per 1,000 steps (per step they are unreadably small).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from divergence.analysis import METRIC_LABELS, TRAJECTORY_METRICS, Analysis, PairData, kind_table, top_layers
from divergence.analysis import dose, every_step, finetune, outcome, reordering, replicates, verdict, window
from divergence.analysis.growth import Estimate
from divergence.analysis.headline import replicates_sentence

ROLES = {
    "optimization": "under study",
    "precision": "reference (the dose ratio's yardstick)",
    "seed": "ceiling (phi) and outcome margin",
    "control": "noise floor",
    "reordering": "reference (the reordering yardstick)",
}
PER = 1000  # growth rates per this many steps


COHERENCE_CAPTION = (
    "C(T) of the update error (the gradient with the optimization on minus off, on the reference arm's "
    "weights and batch) per replicate, against the wander (1) and drift (sqrt(T)) curves; right: per layer."
)


def method() -> list[str]:
    """The report's Method section, rendered from the constants the analysis decides by
    (``docs/method.md`` states them by name; ``tests/report/test_method_text.py`` ties the two)."""
    band = f"{window.RATE_FACTOR:g}"
    return [
        "Each pair trains two models that differ in one thing, from the same initial weights and on the same "
        "batches, and compares them at tracked steps. E(t) = ||theta_a - theta_b|| / ||theta_b|| (whole model); "
        "F(t), when the probe is recorded, is the same for both arms' outputs on a fixed probe set evaluated in "
        "the reference numerics; phi(t) = F(t) / F_seed(t) is the fraction of the way to a different-seed model.",
        "Why not a ratio of slopes: two arms that differ by a small numeric change separate like a chaotic system. "
        "Every pair's difference grows at the same exponential rate (the recipe's lambda) until it saturates near "
        "the seed-to-seed level, the larger dose first, so E_X(t) / E_P(t) is the ratio of the per-step doses "
        "while both grow, whatever the horizon, whereas a ratio of slopes drifts with the horizon and crosses 1.",
        "Dose ratio: per replicate, the median of log10(E_X / E_P) over the unsaturated window: the first stretch "
        f"of steps, before either pair's E reaches {dose.SATURATED_E:g} E_seed, where their local log-growth rates are "
        f"within a factor {band} (without the probe: where the reference still grows at least 1/{band} as fast as "
        "the pair under study), read from one first step common to the replicates, past every replicate's "
        "first-steps transient (the first step from which its log10(E_X / E_P) stays within "
        f"{window.SETTLED_BAND:g} dex of its plateau for the rest of the shared regime). Pooled as a mean over "
        f"replicates with a {replicates.CONFIDENCE:.0%} t interval. A drift above {verdict.MAX_DRIFT:g} dex across "
        "the window is 'not dose-like'. The function-space twin uses F instead of E. lambda: slope of ln E over "
        f"the window; t10 / t50: first step with phi >= {dose.SATURATED_PHI:g} / {dose.HALF_WAY:g}.",
        f"Outcome: Delta = mean over the last {outcome.LAST_FRACTION:.0%} of steps of (l_a - l_b) / l_b (probe "
        "losses, else training losses on the shared batches), against the margin "
        f"m = {outcome.MARGIN_FACTOR:g} x the seed pair's spread of Delta over replicates; a pair under study "
        f"saturated at the end (phi >= {outcome.SATURATED_END:g}) is held to {outcome.SATURATED_FACTOR:g} x the "
        "seed spread ('no larger than a seed change's').",
        "Two answers, each decided on its own. The dose: bounded when its interval lies below 0 (X perturbs less "
        "than low precision), not bounded above 0, inconclusive otherwise. The outcome: within when its interval "
        "lies inside (-m, m), shifted when wholly outside, undecided otherwise. The verdict's status is the dose's; "
        "a shifted outcome makes it not bounded; an undecided outcome is said with the replicates that would decide "
        "it. Replicates that would decide are planned at the observed mean and spread (the fewest n whose t "
        f"interval clears the bound). No verdict without a precision pair, with a window under {dose.MIN_WINDOW} "
        "steps and no bound at every valid step, or with a control pair (two identical arms) that differs as much as the pair under study; a "
        "non-zero control smaller than that is the hardware's run-to-run floor, and the pair is stated against it. "
        "One replicate gives point estimates only: preliminary.",
        every_step.method_text(),
        reordering.method_text(),
        "Fine-tuning: when every pair starts from the same pretrained weights (pair.json's start, or every pair's "
        "E(0) = 0, the seed pair's too), the seed reference is a data-order / noise seed pair, whose E grows from 0 "
        "beside the others instead of starting at a ceiling. The ceiling is then what fine-tuning reaches, the "
        "data-order pair's own level (about each arm's displacement from the start): a window ends where a pair's "
        f"E reaches {finetune.SATURATED_FINETUNE:g} E_seed. The window, the dose ratio and the outcome are read as "
        "from scratch otherwise, and the verdict says it is a fine-tune and what its ceiling was.",
        "Deployment numerics: an optimization is measured where it runs. A flash kernel is used under fp16/bf16 "
        "autocast, so a study trains both arms of its pair there; a pair trained outside its deployment numerics is "
        "said in a caveat. Each arm's numerics (device, precision, kernel, TF32, threads) are in its pair.json.",
        "The method in full: docs/method.md in the divergence repository.",
    ]


def log_e_caption() -> str:
    return (
        "E(t) of every replicate of every pair, log scale; shaded: steps where the pair under study or the "
        f"reference has saturated (E >= {dose.SATURATED_E:g} E_seed). Before saturation all pairs grow at one rate: "
        "parallel lines."
    )


DOSE_CAPTIONS = (
    (
        "dose_ratio",
        "log10(E_X/E_P) over training per replicate; bold: the unsaturated window the estimate reads; "
        "black line and band: the pooled estimate and its 95% t interval.",
    ),
    (
        "phi",
        "phi(t), the fraction of the way to a different-seed model, of the pair under study (red) and the "
        "reference (orange) per replicate; vertical lines: t10 (dotted) and t50 (dashed).",
    ),
    (
        "outcome",
        "The outcome Delta per replicate against the seed margin (-m, m); the seed pair's own Delta "
        "per replicate below it.",
    ),
)


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    align_left: int = 1  # leading columns of text; the rest are numbers


def cost_text(arm_steps: dict | None) -> str | None:
    """The report's cost line: the arm-steps the study trained and those training every pair both its
    arms would have (``DIR/arms.json``), or None outside a study folder."""
    if not arm_steps or not arm_steps["pair_by_pair"]:
        return None
    trained, by_pair = arm_steps["trained"], arm_steps["pair_by_pair"]
    return (
        f"Cost: {trained} arm-steps trained ({trained / by_pair:.2f}x the {by_pair} a pair-by-pair plan trains: "
        "an arm several pairs of a replicate share is trained once)."
    )


def number(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        if value == 0:
            return "0"
        return f"{value:.3g}" if 1e-3 <= abs(value) < 1e4 else f"{value:.2e}"
    return str(value)


def rate(e: Estimate) -> str:
    if not math.isfinite(e.value):
        return "–"
    interval = f" ({number(e.lo * PER)} – {number(e.hi * PER)})" if e.defined else ""
    return number(e.value * PER) + interval


def pairs_table(analysis: Analysis) -> Table:
    rows = []
    for p in analysis.pairs:
        g = analysis.growth[p.key]
        n = len(p.steps)
        rows.append(
            (
                p.name,
                str(p.replicate),
                ROLES.get(p.category, p.category),
                p.description or p.name,
                "yes" if p.finished else f"no (step {p.last_step} of {p.max_steps})",
                str(n),
                *(number(float(p.model[m][-1])) if n else "–" for m in TRAJECTORY_METRICS),
                *(rate(g[m]) for m in TRAJECTORY_METRICS),
            )
        )
    columns = (
        "pair",
        "replicate",
        "role",
        "description",
        "finished",
        "tracked steps",
        *(f"final {METRIC_LABELS[m]}" for m in TRAJECTORY_METRICS),
        *(f"g {METRIC_LABELS[m]} /{PER} steps (95% CI)" for m in TRAJECTORY_METRICS),
    )
    return Table(columns, tuple(rows), align_left=5)


def estimates_table(analysis: Analysis) -> Table:
    """Every estimate behind each verdict: one row per replicate, then the pooled row."""
    rows = []
    for v in analysis.verdicts:
        deltas = v.outcome.per_replicate
        for e in v.dose.estimates:
            span = f"{e.window[0]}-{e.window[1]}" if e.window else "–"
            rows.append(
                (
                    v.study,
                    str(e.replicate),
                    e.space,
                    span,
                    str(e.n_window),
                    signed(e.log10),
                    signed(e.log10_function),
                    signed(e.drift),
                    number(e.lam.get("study")),
                    number(e.lam.get("reference")),
                    censored(e.t10.get("reference")),
                    censored(e.t50.get("reference")),
                    censored(e.t10.get("study")),
                    number(deltas.get(e.replicate)),
                )
            )
        span = f"{v.dose.window[0]}-{v.dose.window[1]}" if v.dose.window else "–"
        rows.append(
            (
                v.study,
                f"pooled ({v.dose.ratio.n})",
                "",
                span,
                "",
                interval(v.dose.ratio),
                interval(v.dose.function),
                signed(v.dose.drift),
                "",
                "",
                "",
                "",
                "",
                interval(v.outcome.delta, signed=False),
            )
        )
    return Table(
        (
            "pair under study",
            "replicate",
            "space",
            "window",
            "steps",
            "log10 E_X/E_P",
            "log10 F_X/F_P",
            "drift (dex)",
            "lambda X /step",
            "lambda P /step",
            "t10 P",
            "t50 P",
            "t10 X",
            "outcome Delta",
        ),
        tuple(rows),
        align_left=3,
    )


def notes(v) -> list[str]:
    """A verdict's reasons and caveats, less those its headline already says; then what more
    replicates would do to the dose interval."""
    said = [n for n in (*v.reasons, *v.caveats) if n.lower() not in v.headline.lower()]
    return said + [s for s in (replicates_sentence(v),) if s]


def signed(value) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:+.2f}"


def censored(step) -> str:
    return "not reached" if step is None else str(step)


def interval(p, signed: bool = True) -> str:
    """A pooled value with its 95% t interval, or the point estimate alone (one replicate)."""
    fmt = (lambda x: f"{x:+.2f}") if signed else number
    if not math.isfinite(p.mean):
        return "–"
    return f"{fmt(p.mean)} ({fmt(p.lo)} – {fmt(p.hi)})" if p.interval else f"{fmt(p.mean)} (no interval)"


def calibration_text(analysis: Analysis) -> list[str]:
    """What the calibration says, when one was given."""
    c = analysis.calibration
    if c is None:
        return []
    criteria = c.get("criteria") or {}
    failed = [k for k, v in criteria.items() if not v.get("pass")]
    line = c.get("line") or {}
    out = [
        f"Calibration ladder (recipe {c.get('recipe', {}).get('id')}): slope {number(line.get('slope'))} "
        f"against log10 of the true dose ratio; "
        + ("every criterion passes." if not failed else f"failed criteria: {', '.join(failed)}.")
    ]
    out += [
        f"{v.study}: perturbs training like a relative gradient noise of {v.dose.equivalent:.1g} per step."
        for v in analysis.verdicts
        if v.dose.equivalent is not None
    ]
    from divergence.analysis.calibration import floor_dose, reference_doses

    out += [
        f"{name} (reference): perturbs training like a relative gradient noise of {eps:.1g} per step."
        for name, eps in reference_doses(c).items()
    ]
    floor = floor_dose(c)
    if floor is not None:
        out.append(
            f"The ladder's floor: the arms' own rounding, once they differ, acts like a relative gradient "
            f"noise of about {floor:.1g} per step; a pair below it is indistinguishable from rounding."
        )
    return out


def top_layers_table(pair: PairData) -> Table:
    rows = tuple(
        (
            r["tensor"],
            r["kind"],
            str(r["numel"]),
            *(number(r[f"final_{m}"]) for m in TRAJECTORY_METRICS),
            *(number(r[f"slope_{m}"] * PER) for m in TRAJECTORY_METRICS),
        )
        for r in top_layers(pair)
    )
    return Table(
        (
            "tensor",
            "kind",
            "numel",
            *(f"final {METRIC_LABELS[m]}" for m in TRAJECTORY_METRICS),
            *(f"slope {METRIC_LABELS[m]} /{PER} steps" for m in TRAJECTORY_METRICS),
        ),
        rows,
        align_left=2,
    )


def kinds_table(pair: PairData) -> Table:
    rows = tuple(
        (
            r["kind"],
            r["top_tensor"],
            str(r["tensors"]),
            str(r["numel"]),
            *(number(r[f"final_{m}"]) for m in TRAJECTORY_METRICS),
            number(r["slope_wasserstein"] * PER),
        )
        for r in kind_table(pair)
    )
    return Table(
        (
            "kind",
            "most divergent tensor",
            "tensors",
            "numel",
            *(f"final {METRIC_LABELS[m]}" for m in TRAJECTORY_METRICS),
            f"slope {METRIC_LABELS['wasserstein']} /{PER} steps",
        ),
        rows,
        align_left=2,
    )


def noise_floor_text(analysis: Analysis) -> list[str]:
    if not analysis.noise_floors:
        return ["No control pair: determinism was not checked, so part of each pair's drift may be run-to-run noise."]
    floors = [
        f"{v.study}: {number(v.floor)} times the control's difference (median over shared steps)."
        for v in analysis.verdicts
        if v.floor is not None
    ]
    out = []
    for f in analysis.noise_floors:
        if f.exact:
            out.append(
                f"Control pair {f.pair} is exactly zero at all {f.n_steps} tracked steps: training is "
                "deterministic, so every difference in the other pairs comes from what they change."
            )
        else:
            out.append(
                f"Warning: control pair {f.pair} is not zero (from step {f.first_nonzero_step}; peak "
                f"Wasserstein {number(f.peak['wasserstein'])}, peak max difference "
                f"{number(f.peak['max_abs_diff'])}). This is the noise floor: drift at or below it "
                "cannot be told apart from run-to-run nondeterminism."
            )
    return out + floors


def spikes_text(pair: PairData) -> str:
    parts = []
    for arm in "ab":
        steps = pair.loss_steps[pair.spikes[arm]].tolist()
        if steps:
            shown = ", ".join(map(str, steps[:12])) + (" …" if len(steps) > 12 else "")
            parts.append(f"arm {arm}: {len(steps)} flagged loss spike(s) at step {shown}")
    return "; ".join(parts) if parts else "No loss spikes flagged in either arm."


def consequence_text(analysis: Analysis) -> list[str]:
    """What the consequence curve the predictions rest on says, when one was given."""
    c = analysis.consequence
    if c is None:
        return []
    out = [
        f"Consequence curve ({c.get('recipe')}, recipe {c.get('recipe_id')}, {c.get('steps')} steps): {c.get('sentence')}"
    ]
    converged = (c.get("convergence") or {}).get("sentence")
    return out + ([converged] if converged else [])


CONSEQUENCE_CAPTIONS = {
    "consequence": "early dose against the converged score and probe-loss shifts, every replicate; the seed "
    "pair's arms over training",
    "consequence_samples": "what the finished models draw, arm a beside arm b, from the same noises",
}
