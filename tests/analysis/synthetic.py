"""Synthetic pair runs with known growth, written through the real store and pair.json.

Layer l of a pair with rate r has, at tracked step t,

    W_l(t) = offset + r * t * (1 + noise * e_{l,t}),   e ~ N(0, 1) iid
    max_l(t) = 3 * W_l(t)

so every layer's expected slope, and hence the pair's growth rate g, is r (per step).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from divergence.analysis import PairData, pair_from_records
from divergence.metrics.grouping import summarize
from divergence.pairfolder.pair_json import PairInfo
from divergence.store import MetricsStore

# (tensor name, kind, numel): one of each kind the report groups by
LAYERS = (
    ("down.0.attn1.to_q.weight", "attn_q", 1024),
    ("down.0.attn1.to_k.weight", "attn_k", 1024),
    ("down.0.attn1.to_v.weight", "attn_v", 1024),
    ("down.0.attn1.to_out.0.weight", "attn_out", 1024),
    ("down.0.attn1.to_out.0.bias", "attn_out", 32),
    ("down.0.resnets.0.conv1.weight", "conv", 9216),
    ("down.0.resnets.0.conv1.bias", "conv", 32),
    ("down.0.resnets.0.norm1.weight", "norm", 32),
    ("down.0.resnets.0.time_emb_proj.weight", "linear", 4096),
    ("mid.attn.to_q.weight", "attn_q", 4096),
    ("mid.resnets.0.conv2.weight", "conv", 36864),
    ("time_embedding.linear_1.weight", "embedding", 2048),
)


def records(
    rate, *, steps=range(0, 201, 10), offset=0.0, noise=0.05, seed=0, spikes=(), layers=LAYERS, nan_layer=None, every=5
):
    """[(step, tensor records, step record)] of a pair whose layers grow at ``rate`` per step.

    A step record is written every ``every`` steps (and at every tracked step and spike): enough
    for loss curves, few enough fsyncs for a fast test.
    """
    rng = np.random.default_rng(seed)
    steps = list(steps)
    out = []
    for t in sorted(set(steps) | set(spikes) | set(range(steps[0], steps[-1] + 1, every))):
        tracked = t in steps
        tensors = (
            [
                _tensor(name, kind, numel, offset + rate * t * (1 + noise * rng.standard_normal()))
                for name, kind, numel in layers
            ]
            if tracked
            else []
        )
        if nan_layer is not None and tracked and t >= steps[len(steps) // 2]:
            tensors[nan_layer] = _tensor(*layers[nan_layer], math.nan)
        out.append((t, tensors, _step(t, tensors, tracked, t in spikes)))
    return out


def info(name, category, *, finished=True, max_steps=None, last_step=200, description=None):
    return PairInfo(
        name=name,
        category=category,
        arms={"a": [f"{name}-a"], "b": [f"{name}-b"]},
        description=description if description is not None else name.replace("-", " "),
        max_steps=max_steps or last_step,
        finished=finished,
        last_step=last_step,
    )


def make_pair(name, category, rate, *, finished=True, max_steps=None, description=None, **kwargs) -> PairData:
    """The pair in memory, through the same reader the report uses (no files: fast)."""
    rows = records(rate, **kwargs)
    steps = [r[2] | {"step": r[0]} for r in rows]
    tensors = [t | {"step": r[0]} for r in rows for t in r[1]]
    return pair_from_records(
        info(name, category, finished=finished, max_steps=max_steps, last_step=rows[-1][0], description=description),
        steps,
        tensors,
    )


def write_pair(folder, name, category, rate, *, finished=True, max_steps=None, description=None, **kwargs):
    """Write a pair run folder (metrics.jsonl + pair.json) whose layers grow at ``rate`` per step."""
    store = MetricsStore(folder).open_for_append()
    rows = records(rate, **kwargs)
    for step, tensors, step_record in rows:
        store.append_step(step, tensors, step_record)
    info(name, category, finished=finished, max_steps=max_steps, last_step=rows[-1][0], description=description).write(
        folder
    )
    return folder


def _tensor(name, kind, numel, w):
    nonfinite = 0 if math.isfinite(w) else 1
    norm = math.sqrt(numel) * 0.02
    return {
        "tensor": name,
        "module": name.rsplit(".", 1)[0],
        "kind": kind,
        "shape": [numel],
        "numel": numel,
        "wasserstein": w,
        "max_abs_diff": 3 * w,
        "mean_abs_diff": w,
        "rms_diff": 1.2 * w,
        "rel_l2": 1.2 * w * math.sqrt(numel) / norm,
        "cosine": 1.0 - w,
        "nonfinite_a": 0,
        "nonfinite_b": nonfinite,
        "norm_a": norm,
        "norm_b": norm,
    }


def _step(t, records, tracked, spike):
    record = {
        "tracked": tracked,
        "loss_a": 1.0 / (1 + 0.02 * t) + (0.5 if spike else 0.0),
        "loss_b": 1.0 / (1 + 0.02 * t) + 0.001,
        "loss_diff": 0.001,
        "spike_a": spike,
        "spike_b": False,
    }
    if tracked:
        kinds = {}
        for kind in {r["kind"] for r in records}:
            kinds[kind] = {m: v for m, v in summarize([r for r in records if r["kind"] == kind]).items()}
        record.update({m: v for m, v in summarize(records).items()}, kinds=kinds)
    return record


def study_pairs(*, study=1e-4, precision=4e-4, seed_rate=1.25e-4, control=0.0, overrides=None) -> list[PairData]:
    """The four pairs of the paper's design in memory; a rate of None leaves a pair out."""
    return [
        make_pair(name, category, rate, **options)
        for name, category, rate, options in _study_specs(study, precision, seed_rate, control, overrides or {})
    ]


def write_study(root, *, study=1e-4, precision=4e-4, seed_rate=1.25e-4, control=0.0, overrides=None):
    """A study folder with the four pairs of the paper's design; a rate of None leaves a pair out."""
    for name, category, rate, options in _study_specs(study, precision, seed_rate, control, overrides or {}):
        write_pair(root / name, name, category, rate, **options)
    return root


def _study_specs(study, precision, seed_rate, control, overrides):
    """(name, category, rate, options); ``overrides[name]`` overrides one pair's options."""
    specs = [
        ("flash-vs-baseline", "optimization", study, "flash vs baseline"),
        ("fp16-vs-fp32", "precision", precision, "fp16 vs fp32"),
        ("seed-vs-seed", "seed", seed_rate, "seed 0 vs seed 1"),
        ("control", "control", control, "control"),
    ]
    for i, (name, category, rate, description) in enumerate(specs):
        if rate is None:
            continue
        options = {
            "offset": 0.01 if category == "seed" else 0.0,  # different inits start apart
            "seed": i,
            "description": description,
            "noise": 0.0 if category == "control" else 0.05,
        }
        yield name, category, rate, options | overrides.get(name, {})


# ---------------------------------------------------------------------------------------------
# Pair runs with a known dose (docs/method.md): shared exponential growth, then saturation.
#
# Pair p, replicate r, tracked step t >= 1 (E = 0 at step 0: both arms start from one init):
#
#     E_{p,r}(t) = u / (1 + u / E_sat),   u = eps_p * exp(lambda * t) * 10 ** (REP_DEX * z_{p,r}) * n_t
#     F_{p,r}(t) = the same with scale K_F and saturation F_sat = 1 (the probe)
#
# z ~ N(0, 1) per pair and replicate (run-to-run variance), n_t lognormal per step. The seed pair
# (different inits) sits at the seed level from step 0: E_S = E_sat, F_S = 1. So log10(E_X/E_P) =
# log10(eps_X/eps_P) exactly while both are far below saturation, whatever the horizon.
# The outcome: l_a = l_b (1 + OUTCOME * phi(t) * w_{p,r}), w ~ N(0, 1): a pair moves the final loss
# in proportion to how far it has gone towards a different-seed model.
# ---------------------------------------------------------------------------------------------

LAMBDA = 0.02
E_SAT = 1.0
K_F = 2.0
REP_DEX = 0.05
STEP_DEX = 0.01
OUTCOME = 0.02
DOSE_LAYERS = LAYERS[:3]


def dense_steps(horizon: int) -> list[int]:
    """The default tracking schedule: every step to 20, every 5 to 100, then every 10."""
    return sorted({*range(0, 21), *range(25, 101, 5), *range(110, horizon + 1, 10)} & set(range(horizon + 1)))


def _curve(eps, steps, scale, sat, rng):
    t = np.asarray(steps, dtype=float)
    u = eps * scale * np.exp(LAMBDA * t) * 10 ** (STEP_DEX * rng.standard_normal(len(t)))
    return np.where(t > 0, u / (1 + u / sat), 0.0)


def dose_records(name, category, eps, *, replicate=0, horizon=400, probe=True, loss_every=5):
    """(step records, tensor records) of one replicate; ``eps`` None gives a seed pair (saturated)."""
    rng = np.random.default_rng([zlib_key(name), replicate])
    amplitude, w = 10 ** (REP_DEX * rng.standard_normal()), rng.standard_normal()
    steps = dense_steps(horizon)
    if category == "seed":
        e = E_SAT * 10 ** (STEP_DEX * rng.standard_normal(len(steps)))
        f = 10 ** (STEP_DEX * rng.standard_normal(len(steps)))
    else:
        e = _curve(eps * amplitude, steps, 1.0, E_SAT, rng)
        f = _curve(eps * amplitude, steps, K_F, 1.0, rng)
    phi = dict(zip(steps, np.minimum(f, 1.0)))
    step_records, tensors = [], []
    for t in sorted(set(steps) | set(range(0, horizon + 1, loss_every))):
        loss_b = 1.0 / (1 + 0.02 * t)
        share = phi.get(t, phi[max(s for s in steps if s <= t)])
        record = {
            "step": t,
            "tracked": t in phi,
            "loss_b": loss_b,
            "loss_a": loss_b * (1 + OUTCOME * share * w) if category != "control" or eps else loss_b,
            "spike_a": False,
            "spike_b": False,
        }
        if t in phi:
            i = steps.index(t)
            rows = [_tensor(n, k, numel, float(e[i]) * 0.01) | {"step": t} for n, k, numel in DOSE_LAYERS]
            record.update(summarize(rows), rel_l2=float(e[i]), kinds={r["kind"]: summarize([r]) for r in rows})
            if probe:
                record.update(
                    probe_rel_diff=float(f[i]), probe_loss_b=loss_b, probe_loss_a=loss_b * (1 + OUTCOME * share * w)
                )
            tensors += rows
        step_records.append(record)
    return step_records, tensors


def zlib_key(name: str) -> int:
    import zlib

    return zlib.crc32(name.encode())


FULL = 800  # every run is drawn to this step and cut at its horizon: one replicate, any horizon


def dose_pair(name, category, eps, *, replicate=0, horizon=400, probe=True, recipe=None, description=None):
    """One replicate of a pair with per-step dose ``eps``, in memory through the report's reader."""
    from divergence.analysis.calibration import truncate

    full = _full_pair(name, category, eps, replicate, probe, description)
    recipe = dict(recipe or {})
    return dataclasses.replace(truncate(full, horizon), last_step=horizon, max_steps=horizon, recipe=recipe)


@functools.lru_cache(maxsize=256)
def _full_pair(name, category, eps, replicate, probe, description):
    steps, tensors = dose_records(name, category, eps, replicate=replicate, horizon=max(FULL, 0), probe=probe)
    return pair_from_records(
        info(name, category, last_step=FULL, description=description), steps, tensors, replicate=replicate
    )


DOSE_STUDY = (
    ("flash-vs-baseline", "optimization", "flash vs baseline"),
    ("bf16-vs-fp32", "precision", "bf16 vs fp32"),
    ("seed-vs-seed", "seed", "seed 0 vs seed 1"),
    ("control", "control", "control"),
    ("reordering", "reordering", "4x4 vs 1x16 accumulation"),
)


def _dose_specs(study, precision, control, replicates, seed, reordering=None):
    """(name, category, description, eps, replicate) of the study design; None leaves a pair out
    (the reordering reference is left out unless its dose is given)."""
    doses = {
        "optimization": study,
        "precision": precision,
        "seed": 0.0 if seed else None,
        "control": control,
        "reordering": reordering,
    }
    for name, category, description in DOSE_STUDY:
        if doses[category] is None:
            continue
        for r in range(1 if category == "control" else replicates):
            yield name, category, description, doses[category], r


def dose_study(
    *, study=1e-8, precision=1e-5, control=0.0, replicates=4, horizon=400, probe=True, seed=True, reordering=None
) -> list[PairData]:
    """The study design with known doses; ``precision``/``control`` None or ``seed`` False leave a pair
    out; ``reordering`` (a dose) adds the reordering reference."""
    return [
        dose_pair(name, category, eps, replicate=r, horizon=horizon, probe=probe, description=description)
        for name, category, description, eps, r in _dose_specs(study, precision, control, replicates, seed, reordering)
    ]


def write_dose_study(
    root,
    *,
    study=1e-8,
    precision=1e-5,
    control=0.0,
    replicates=4,
    horizon=200,
    probe=True,
    seed=True,
    reordering=None,
    router=None,
    extra=None,
):
    """The same pairs as run folders (metrics.jsonl + pair.json with ``replicate``) under ``root``;
    ``router`` ({category: flip fraction}) adds an MoE router's record to those pairs' probed steps
    (every 10th: ``router_flip`` rising linearly to the fraction at ``horizon``, arm a's drops falling
    linearly from 2% at step 0 to 1% at ``horizon``, arm b's from 4% to 2%);
    ``extra(category, replicate, step) -> dict`` adds keys to a step record (e.g. the coherence's)."""
    import json

    for name, category, description, eps, r in _dose_specs(study, precision, control, replicates, seed, reordering):
        folder = root / f"{name}-r{r}"
        steps, tensors = dose_records(name, category, eps, replicate=r, horizon=FULL, probe=probe, loss_every=10)
        steps = [record for record in steps if record["step"] <= horizon]
        if router and category in router:
            for record in steps:
                if record["tracked"] and record["step"] % 10 == 0:
                    flip = router[category] * record["step"] / horizon
                    fall = 1 - record["step"] / (2 * horizon)  # drops halve as the router balances
                    record.update(router_flip=flip, router_drop_a=0.02 * fall, router_drop_b=0.04 * fall)
        store = MetricsStore(folder).open_for_append()
        for record in steps:
            rows = [{k: v for k, v in t.items() if k != "step"} for t in tensors if t["step"] == record["step"]]
            more = extra(category, r, record["step"]) if extra else {}
            store.append_step(record["step"], rows, {k: v for k, v in record.items() if k != "step"} | more)
        info(name, category, last_step=horizon, description=description).write(folder)
        data = json.loads((folder / "pair.json").read_text())
        (folder / "pair.json").write_text(json.dumps(data | {"replicate": r}))
    return root


# ---------------------------------------------------------------------------------------------
# A bug against a reordering (docs/method.md, "The reordering yardstick"): a bug injects a bias
# each step, which adds up, E_X(t) = eps_X * t; a reordering's rounding sits at its floor,
# E_R(t) = FLOOR * 10 ** (STEP_DEX * n_t). The two do not grow alike, so no window forms.
# ---------------------------------------------------------------------------------------------

FLOOR = 1e-7


def bug_study(eps_x: float, *, replicates: int = 3, horizon: int = 40) -> list[PairData]:
    """The dose study (no probe: weight space) with the pair under study's E linear in t, at
    ``eps_x * t`` times a replicate amplitude 10 ** (REP_DEX z), and the reordering pair's E flat
    at ``FLOOR``: log10(E_X / E_R) = log10(eps_x / FLOOR) + log10(t) at every tracked step t >= 1."""
    pairs = dose_study(study=1e-8, precision=1e-5, reordering=1e-9, replicates=replicates, horizon=horizon, probe=False)
    out = []
    for p in pairs:
        rng = np.random.default_rng([zlib_key(p.name), p.replicate, 1])
        t = np.asarray(p.steps, dtype=float)
        if p.category == "optimization":
            e = eps_x * t * 10 ** (REP_DEX * rng.standard_normal())
        elif p.category == "reordering":
            e = np.where(t > 0, FLOOR * 10 ** (STEP_DEX * rng.standard_normal(len(t))), 0.0)
        else:
            out.append(p)
            continue
        out.append(dataclasses.replace(p, rel_l2=e))
    return out
