"""Per-tensor records rolled up per module, per kind of layer, and for the whole model.

A tensor ``down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.weight`` belongs to
the module ``...attn1.to_q`` (its parent path) and to the kind ``attn_q``. Aggregates are
exact functions of the per-tensor records, with N_t the tensor's element count:

    wasserstein    sum_t N_t W_t / sum_t N_t            (numel-weighted mean)
    max_abs_diff   max_t max_abs_diff_t
    mean_abs_diff  sum_t N_t mad_t / sum_t N_t          (= mean |d| over all elements)
    rms_diff       sqrt(sum_t N_t rms_t^2 / sum_t N_t)  (= rms of d over all elements)
    rel_l2         sqrt(sum_t ||d_t||^2) / sqrt(sum_t ||a_t||^2)   (global, not a mean)
    cosine         sum_t <a_t, b_t> / sqrt(sum_t ||a_t||^2 sum_t ||b_t||^2)

Norms past 2^200 are squared as (norm 2^-k)^2, scaled back after (exact, as in
``divergence.metrics.difference``), so finite records give finite aggregates.

Records with non-finite metrics (a NaN or inf in either tensor) are left out of the sums
and counted in ``tensors_nonfinite``, so they never poison an aggregate silently. Empty
tensors (N_t = 0) weigh nothing; a group of empty tensors alone has the empty pair's values
(every difference 0, cosine 1: ``divergence.metrics.pair.compare_tensors``).

Integer and bool tensors on both sides (``num_batches_tracked``, ``position_ids``, masks)
are buffers, not weights: a step counter that differs by 1000 would otherwise be the whole
model's max_abs_diff. They are left out of the sums by default and counted in ``buffers``;
``include_buffers=True`` counts them like any tensor.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Iterable

from divergence.metrics.difference import cosine_from_sums, outside_exponent, relative_l2
from divergence.metrics.pair import METRIC_NAMES

GROUPINGS = ("tensor", "module", "kind", "model")
# dtype names (``TensorInfo.dtype``) of buffers: integer and bool tensors.
BUFFER_DTYPES = frozenset({"bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64"})
KINDS = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_out", "linear", "conv", "norm", "embedding", "other")

# Module names (last path component, trailing list indices dropped) of attention projections
# in diffusers, transformers (CLIP, BERT, GPT-2, LLaMA), torch.nn.MultiheadAttention and timm.
# Joint attention (SD3's MMDiT, Flux) projects the caption stream with ``add_*_proj`` and
# ``to_add_out``: the same roles, so the same kinds. A LoRA record ``<module>.lora_delta``
# (divergence.checkpoints.lora) takes its module's kind.
_ATTENTION = {
    "attn_q": {"to_q", "q_proj", "query", "q", "wq", "q_lin", "add_q_proj"},
    "attn_k": {"to_k", "k_proj", "key", "k", "wk", "k_lin", "add_k_proj"},
    "attn_v": {"to_v", "v_proj", "value", "v", "wv", "v_lin", "add_v_proj"},
    "attn_qkv": {"qkv", "c_attn", "qkv_proj", "wqkv", "in_proj", "to_qkv", "to_added_qkv"},
    "attn_out": {"to_out", "out_proj", "o_proj", "wo", "out_lin", "c_proj_attn", "to_add_out"},
}
# Generic projection names that are the attention output projection inside an attention block:
# nanoGPT's and GPT-2's ``attn.c_proj`` (``mlp.c_proj`` is the MLP's), timm's ``attn.proj``,
# BERT's ``attention.output.dense``. The block is one of the two modules above the projection.
_OUT_IN_ATTENTION = {"c_proj", "proj", "dense", "out"}
_ATTENTION_BLOCK = re.compile(r"attn|attention(?!s$)", re.I)  # not diffusers' ``attentions`` (a list of blocks)
_NORM = re.compile(r"(^|_)(norm|ln|bn|layernorm|layer_norm|group_norm|batchnorm)(_|\d|$)|norm\d*$", re.I)
_INDEX = re.compile(r"^\d+$")


def module_of(name: str) -> str:
    """Parent path of a parameter name: ``a.b.weight`` -> ``a.b``; top-level -> ``''``."""
    return name.rsplit(".", 1)[0] if "." in name else ""


def classify_kinds(shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """Kind of every tensor, from its name and the shapes of its module's tensors.

    The module's ``weight`` decides linear (2-D) vs conv (3-D and up), so a bias lands with
    its weight. ``nn.MultiheadAttention``'s ``in_proj_weight`` counts as ``attn_qkv``.
    """
    weight_ndim = {module_of(n): len(s) for n, s in shapes.items() if n.rsplit(".", 1)[-1] == "weight"}
    return {name: _kind(name, shape, weight_ndim.get(module_of(name))) for name, shape in shapes.items()}


def _kind(name: str, shape: tuple[int, ...], weight_ndim: int | None) -> str:
    leaf = name.rsplit(".", 1)[-1]
    if leaf.startswith("in_proj_"):
        return "attn_qkv"
    parts = [p for p in module_of(name).split(".") if p and not _INDEX.match(p)]
    last = parts[-1].lower() if parts else ""
    for kind, names in _ATTENTION.items():
        if last in names:
            return kind
    if last in _OUT_IN_ATTENTION and any(_ATTENTION_BLOCK.search(p) for p in parts[-3:-1]):
        return "attn_out"
    if last and (_NORM.search(last) or last in {"ln_f", "ln_1", "ln_2", "final_layer_norm"}):
        return "norm"
    if "embed" in last or last in {"wte", "wpe"}:
        return "embedding"
    ndim = weight_ndim if weight_ndim is not None else len(shape)
    if ndim >= 3 or "conv" in last:
        return "conv"
    if ndim == 2:
        return "linear"
    return "other"


def group_key(record: dict, by: str) -> str:
    if by == "module":
        return module_of(record["name"]) or "(root)"
    if by == "kind":
        return record["kind"]
    if by == "model":
        return "model"
    raise ValueError(f"grouping {by!r} is not one of {', '.join(GROUPINGS)}")


def aggregate(records: Iterable[dict], by: str, include_buffers: bool = False) -> list[dict]:
    """Records grouped by ``by`` (tensor, module, kind, model), one aggregate dict per group."""
    if by == "tensor":
        return [dict(r, group=r["name"]) for r in records]
    groups: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        groups[group_key(record, by)].append(record)
    # a group of buffers alone is summarized on its own values; in a mixed group they are left out
    return [
        dict(summarize(members, include_buffers or all(map(is_buffer, members))), group=key)
        for key, members in groups.items()
    ]


def is_buffer(record: dict) -> bool:
    """Both sides of the record are integer or bool tensors."""
    return record.get("dtype_a") in BUFFER_DTYPES and record.get("dtype_b") in BUFFER_DTYPES


def summarize(records: Iterable[dict], include_buffers: bool = False) -> dict:
    """The aggregate of a set of records (see the module docstring for the formulas)."""
    records = list(records)
    buffers = 0 if include_buffers else sum(map(is_buffer, records))
    if buffers:
        records = [r for r in records if not is_buffer(r)]
    finite = [r for r in records if all(_finite(r[m]) for m in METRIC_NAMES)]
    out = {
        "buffers": buffers,
        "buffers_included": include_buffers,
        "tensors": len(records),
        "numel": sum(r["numel"] for r in records),
        "tensors_nonfinite": len(records) - len(finite),
        "nonfinite_a": sum(r["nonfinite_a"] for r in records),
        "nonfinite_b": sum(r["nonfinite_b"] for r in records),
    }
    n = sum(r["numel"] for r in finite)
    if not finite:
        return out | {m: math.nan for m in METRIC_NAMES}
    if n == 0:  # empty tensors only: nothing differs
        return out | {m: 0.0 for m in METRIC_NAMES} | {"cosine": 1.0}
    # squares of norms (||a||, ||b||, ||d||) past 2^200 taken as (x 2^-k)^2, exact (see metrics.difference)
    k = outside_exponent(max(max(r["norm_a"], r["norm_b"], r["rms_diff"] * math.sqrt(r["numel"])) for r in finite))
    sq_diff = math.fsum(r["numel"] * math.ldexp(r["rms_diff"], -k) ** 2 for r in finite)
    sq_a = math.fsum(math.ldexp(r["norm_a"], -k) ** 2 for r in finite)
    sq_b = math.fsum(math.ldexp(r["norm_b"], -k) ** 2 for r in finite)
    return out | {
        "wasserstein": math.fsum(r["numel"] * r["wasserstein"] for r in finite) / n,
        "max_abs_diff": max(r["max_abs_diff"] for r in finite),
        "mean_abs_diff": math.fsum(r["numel"] * r["mean_abs_diff"] for r in finite) / n,
        "rms_diff": math.ldexp(math.sqrt(sq_diff / n), k),
        "rel_l2": relative_l2(sq_diff, sq_a),
        # <a, b> = (||a||^2 + ||b||^2 - ||a - b||^2) / 2
        "cosine": cosine_from_sums((sq_a + sq_b - sq_diff) / 2, sq_a, sq_b),
    }


def _finite(value) -> bool:
    """A usable metric value: not missing, not NaN (rel_l2 may be inf when ||a|| = 0)."""
    return value is not None and not math.isnan(value)
