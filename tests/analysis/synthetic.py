"""Synthetic pair runs with known growth, written through the real store and pair.json.

Layer l of a pair with rate r has, at tracked step t,

    W_l(t) = offset + r * t * (1 + noise * e_{l,t}),   e ~ N(0, 1) iid
    max_l(t) = 3 * W_l(t)

so every layer's expected slope, and hence the pair's growth rate g, is r (per step).
"""

from __future__ import annotations

import math

import numpy as np

from divergence.analysis import PairData, pair_from_records
from divergence.metrics.grouping import summarize
from divergence.store import MetricsStore
from divergence.store.pair_info import PairInfo

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


def records(rate, *, steps=range(0, 201, 10), offset=0.0, noise=0.05, seed=0, spikes=(), layers=LAYERS,
            nan_layer=None, every=5):
    """[(step, tensor records, step record)] of a pair whose layers grow at ``rate`` per step.

    A step record is written every ``every`` steps (and at every tracked step and spike): enough
    for loss curves, few enough fsyncs for a fast test.
    """
    rng = np.random.default_rng(seed)
    steps = list(steps)
    out = []
    for t in sorted(set(steps) | set(spikes) | set(range(steps[0], steps[-1] + 1, every))):
        tracked = t in steps
        tensors = [_tensor(name, kind, numel, offset + rate * t * (1 + noise * rng.standard_normal()))
                   for name, kind, numel in layers] if tracked else []
        if nan_layer is not None and tracked and t >= steps[len(steps) // 2]:
            tensors[nan_layer] = _tensor(*layers[nan_layer], math.nan)
        out.append((t, tensors, _step(t, tensors, tracked, t in spikes)))
    return out


def info(name, category, *, finished=True, max_steps=None, last_step=200, description=None):
    return PairInfo(name=name, category=category, arms={"a": [f"{name}-a"], "b": [f"{name}-b"]},
                    description=description if description is not None else name.replace("-", " "),
                    max_steps=max_steps or last_step, finished=finished, last_step=last_step)


def make_pair(name, category, rate, *, finished=True, max_steps=None, description=None, **kwargs) -> PairData:
    """The pair in memory, through the same reader the report uses (no files: fast)."""
    rows = records(rate, **kwargs)
    steps = [r[2] | {"step": r[0]} for r in rows]
    tensors = [t | {"step": r[0]} for r in rows for t in r[1]]
    return pair_from_records(info(name, category, finished=finished, max_steps=max_steps, last_step=rows[-1][0],
                                  description=description), steps, tensors)


def write_pair(folder, name, category, rate, *, finished=True, max_steps=None, description=None, **kwargs):
    """Write a pair run folder (metrics.jsonl + pair.json) whose layers grow at ``rate`` per step."""
    store = MetricsStore(folder).open_for_append()
    rows = records(rate, **kwargs)
    for step, tensors, step_record in rows:
        store.append_step(step, tensors, step_record)
    info(name, category, finished=finished, max_steps=max_steps, last_step=rows[-1][0],
         description=description).write(folder)
    return folder


def _tensor(name, kind, numel, w):
    nonfinite = 0 if math.isfinite(w) else 1
    norm = math.sqrt(numel) * 0.02
    return {"tensor": name, "module": name.rsplit(".", 1)[0], "kind": kind, "shape": [numel], "numel": numel,
            "wasserstein": w, "max_abs_diff": 3 * w, "mean_abs_diff": w, "rms_diff": 1.2 * w,
            "rel_l2": 1.2 * w * math.sqrt(numel) / norm, "cosine": 1.0 - w, "nonfinite_a": 0, "nonfinite_b": nonfinite,
            "norm_a": norm, "norm_b": norm}


def _step(t, records, tracked, spike):
    record = {"tracked": tracked, "loss_a": 1.0 / (1 + 0.02 * t) + (0.5 if spike else 0.0),
              "loss_b": 1.0 / (1 + 0.02 * t) + 0.001, "loss_diff": 0.001, "spike_a": spike, "spike_b": False}
    if tracked:
        kinds = {}
        for kind in {r["kind"] for r in records}:
            kinds[kind] = {m: v for m, v in summarize([r for r in records if r["kind"] == kind]).items()}
        record.update({m: v for m, v in summarize(records).items()}, kinds=kinds)
    return record


def study_pairs(*, study=1e-4, precision=4e-4, seed_rate=1.25e-4, control=0.0, overrides=None) -> list[PairData]:
    """The four pairs of the paper's design in memory; a rate of None leaves a pair out."""
    return [make_pair(name, category, rate, **options) for name, category, rate, options
            in _study_specs(study, precision, seed_rate, control, overrides or {})]


def write_study(root, *, study=1e-4, precision=4e-4, seed_rate=1.25e-4, control=0.0, overrides=None):
    """A study folder with the four pairs of the paper's design; a rate of None leaves a pair out."""
    for name, category, rate, options in _study_specs(study, precision, seed_rate, control, overrides or {}):
        write_pair(root / name, name, category, rate, **options)
    return root


def _study_specs(study, precision, seed_rate, control, overrides):
    """(name, category, rate, options); ``overrides[name]`` overrides one pair's options."""
    specs = [("flash-vs-baseline", "optimization", study, "flash vs baseline"),
             ("fp16-vs-fp32", "precision", precision, "fp16 vs fp32"),
             ("seed-vs-seed", "seed", seed_rate, "seed 0 vs seed 1"),
             ("control", "control", control, "control")]
    for i, (name, category, rate, description) in enumerate(specs):
        if rate is None:
            continue
        options = {"offset": 0.01 if category == "seed" else 0.0,  # different inits start apart
                   "seed": i, "description": description, "noise": 0.0 if category == "control" else 0.05}
        yield name, category, rate, options | overrides.get(name, {})
