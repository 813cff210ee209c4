"""A pair run's records as arrays: whole-model, per-kind and per-layer trajectories, losses.

A *layer* here is one compared weight tensor (``...attn1.to_q.weight``), the unit the store
records. For a pair p with tracked steps t_1 < ... < t_T and a metric m (Wasserstein distance
or max difference):

    D_p(t)        whole-model value at step t, from the step record (the numel-weighted mean
                  of the layers' Wasserstein distances; the max over layers of the max
                  difference; see ``divergence.metrics.grouping``)
    D_{p,l}(t)    layer l's value at step t, from its tensor record
    R_p(t)        = D_p(t) - D_p(t_1), the growth since the first tracked step

The relative trajectory is a difference, not a quotient D(t)/D(t_1): pairs that share their
initial weights start at D(t_1) = 0 when step 0 is tracked, where a quotient is undefined,
and a difference puts every pair on a common origin so their slopes can be read off one
plot (the paper's Fig. 8; the paper does not define its "relative" difference).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from divergence.metrics import METRIC_NAMES, TRAJECTORY_METRICS
from divergence.metrics.grouping import summarize
from divergence.pairfolder.pair_json import pair_label

METRIC_LABELS = {"wasserstein": "Wasserstein distance", "max_abs_diff": "max difference"}
# optional keys of a tracked step record: the function-space probe (F(t), and both arms' losses on it)
PROBE_KEYS = ("probe_rel_diff", "probe_loss_a", "probe_loss_b")
# optional keys of an MoE pair's probed step record (divergence.metrics.router): the fraction of the
# probe's (token, slot) choices whose expert differs between the arms, and each arm's capacity drops
ROUTER_KEYS = ("router_flip", "router_drop_a", "router_drop_b")


@dataclass(frozen=True)
class PairData:
    """Everything the analysis reads from one pair run, as arrays (T tracked steps, L layers)."""

    name: str
    category: str  # optimization | seed | precision | control
    description: str
    finished: bool
    last_step: int | None
    max_steps: int
    steps: np.ndarray  # (T,) tracked steps, ascending
    model: dict[str, np.ndarray]  # metric -> (T,) whole-model value
    layers: tuple[str, ...]  # (L,) tensor names, in the order first recorded
    kinds: tuple[str, ...]  # (L,) kind of each layer (attn_q, conv, norm, ...)
    numel: np.ndarray  # (L,) element count of each layer
    layer_values: dict[str, np.ndarray]  # metric -> (L, T); NaN where missing or non-finite
    kind_values: dict[str, dict[str, np.ndarray]]  # kind -> metric -> (T,)
    loss_steps: np.ndarray  # (S,) every recorded training step
    loss: dict[str, np.ndarray]  # "a"/"b" -> (S,) training loss of each arm (NaN if absent)
    spikes: dict[str, np.ndarray]  # "a"/"b" -> (S,) bool, the trainer's loss-spike flags
    folder: str = ""
    arms: dict = field(default_factory=dict)
    replicate: int = 0  # pair runs are identified by (name, replicate)
    recipe: dict = field(default_factory=dict)  # the resolved base recipe from pair.json
    # E(t): whole-model ||theta_a - theta_b|| / ||theta_b|| at the tracked steps, (T,)
    rel_l2: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # the function-space probe at the tracked steps: PROBE_KEYS -> (T,), NaN where not recorded
    probe: dict[str, np.ndarray] = field(default_factory=dict)
    # pair.json's numerics of each arm ({} when not recorded) and its outside-deployment line
    numerics: dict = field(default_factory=dict)
    outside_deployment: str | None = None
    # the router's record of an MoE pair: ROUTER_KEYS -> (T,), NaN where not probed; {} without MoE
    router: dict[str, np.ndarray] = field(default_factory=dict)
    # pair.json's ``start``: the pretrained weights both arms start from (a fine-tune); None: not recorded
    start: str | None = None
    # pair.json's ``expect_identity``: the change should be the identity in fp32; None: not declared
    expect_identity: bool | None = None

    @property
    def label(self) -> str:
        """What a verdict calls the pair (``pair_label``): the description, else the name."""
        return pair_label(self.name, self.description, self.arms)

    @property
    def key(self) -> str:
        """Unique among the inputs: the name, with the replicate when it is not 0."""
        return self.name if self.replicate == 0 else f"{self.name}#{self.replicate}"

    def has_probe(self) -> bool:
        """Whether the store recorded the probe (``probe_rel_diff``) at any tracked step."""
        values = self.probe.get("probe_rel_diff")
        return values is not None and bool(np.isfinite(values).any())

    def has_router(self) -> bool:
        """Whether the store recorded the router's flip fraction (an MoE pair) at any tracked step."""
        values = self.router.get("router_flip")
        return values is not None and bool(np.isfinite(values).any())

    def relative(self, metric: str) -> np.ndarray:
        """R(t) = D(t) - D(t_1): growth of the whole-model metric since the first tracked step."""
        values = self.model[metric]
        return values - values[0] if values.size else values

    def finite_layers(self, metric: str) -> np.ndarray:
        """(L,) bool: layers whose metric is finite at every tracked step."""
        return np.isfinite(self.layer_values[metric]).all(axis=1)


def pair_from_records(
    info, step_records: list[dict], tensor_records, folder: str = "", replicate: int | None = None
) -> PairData:
    """Build a ``PairData`` from a ``PairInfo`` and the store's step and tensor records.

    ``replicate`` defaults to ``info.replicate``."""
    step_records = sorted(step_records, key=lambda r: r["step"])
    tracked = [r for r in step_records if r.get("tracked")]
    steps = np.array([r["step"] for r in tracked], dtype=np.int64)
    column = {int(s): i for i, s in enumerate(steps)}
    by_step: dict[int, list[dict]] = defaultdict(list)
    for record in tensor_records:
        if record["step"] in column:
            by_step[record["step"]].append(record)
    layers, kinds, numel, layer_values = _layer_arrays(by_step, column, len(steps))
    model = {
        m: np.array([_model_value(r, by_step[r["step"]], m) for r in tracked], dtype=float) for m in TRAJECTORY_METRICS
    }
    return PairData(
        name=info.name,
        category=info.category,
        description=info.description,
        finished=bool(info.finished),
        last_step=info.last_step,
        max_steps=int(info.max_steps or 0),
        folder=str(folder),
        arms=dict(info.arms or {}),
        steps=steps,
        model=model,
        layers=layers,
        kinds=kinds,
        numel=numel,
        layer_values=layer_values,
        kind_values=_kind_arrays(tracked, by_step),
        loss_steps=np.array([r["step"] for r in step_records], dtype=np.int64),
        loss={arm: np.array([_float(r.get(f"loss_{arm}")) for r in step_records]) for arm in "ab"},
        spikes={arm: np.array([bool(r.get(f"spike_{arm}")) for r in step_records], dtype=bool) for arm in "ab"},
        replicate=int(info.replicate) if replicate is None else int(replicate),
        recipe=dict(info.recipe or {}),
        rel_l2=np.array([_model_value(r, by_step[r["step"]], "rel_l2") for r in tracked], dtype=float),
        probe={k: np.array([_float(r.get(k)) for r in tracked]) for k in PROBE_KEYS},
        numerics=dict(info.numerics or {}),
        outside_deployment=info.outside_deployment,
        router={k: np.array([_float(r.get(k)) for r in tracked]) for k in ROUTER_KEYS if any(k in r for r in tracked)},
        start=info.start,
        expect_identity=info.expect_identity,
    )


def _layer_arrays(by_step: dict[int, list[dict]], column: dict[int, int], n_steps: int):
    index: dict[str, int] = {}
    kinds: list[str] = []
    numel: list[int] = []
    for step in sorted(by_step):
        for record in by_step[step]:
            if record["tensor"] not in index:
                index[record["tensor"]] = len(index)
                kinds.append(record.get("kind", "other"))
                numel.append(int(record.get("numel", 1)))
    values = {m: np.full((len(index), n_steps), np.nan) for m in TRAJECTORY_METRICS}
    for step, records in by_step.items():
        for record in records:
            for m in TRAJECTORY_METRICS:
                values[m][index[record["tensor"]], column[step]] = _float(record.get(m))
    return tuple(index), tuple(kinds), np.array(numel, dtype=float), values


def _kind_arrays(tracked: list[dict], by_step: dict[int, list[dict]]) -> dict[str, dict[str, np.ndarray]]:
    """kind -> metric -> (T,), from the step records' ``kinds`` (recomputed if absent)."""
    per_step = []
    for record in tracked:
        kinds = record.get("kinds")
        if kinds is None:
            groups: dict[str, list[dict]] = defaultdict(list)
            for r in by_step[record["step"]]:
                groups[r.get("kind", "other")].append(r)
            kinds = {k: summarize(rs) for k, rs in groups.items() if _summarizable(rs)}
        per_step.append(kinds)
    names = sorted({k for kinds in per_step for k in kinds})
    return {
        k: {m: np.array([_float(kinds.get(k, {}).get(m)) for kinds in per_step]) for m in TRAJECTORY_METRICS}
        for k in names
    }


def _model_value(step_record: dict, tensor_records: list[dict], metric: str) -> float:
    """The step record's whole-model value; recomputed from the tensor records if absent."""
    if metric in step_record:
        return _float(step_record[metric])
    if tensor_records and _summarizable(tensor_records):
        return _float(summarize(tensor_records)[metric])
    return math.nan


def _summarizable(records: list[dict]) -> bool:
    """Whether every record holds what ``summarize`` reads."""
    keys = (*METRIC_NAMES, "numel", "norm_a", "norm_b", "nonfinite_a", "nonfinite_b")
    return all(all(k in r for k in keys) for r in records)


def _float(value) -> float:
    return math.nan if value is None else float(value)


def router_summary(pair: PairData) -> dict | None:
    """The router's record at the probed steps (``step``, ``flip``, ``drop_a``, ``drop_b``; None
    where a key was not recorded), None for a pair without MoE layers."""
    if not pair.has_router():
        return None
    probed = np.isfinite(pair.router["router_flip"])
    out = {"step": pair.steps[probed].tolist()}
    for key in ROUTER_KEYS:
        values = pair.router.get(key)
        out[key.removeprefix("router_")] = (
            [v if math.isfinite(v) else None for v in values[probed].tolist()] if values is not None else None
        )
    return out
