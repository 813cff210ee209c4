"""Per-module / per-kind / whole-model aggregates equal the metrics of the concatenation."""

import math

import pytest
import torch

from divergence.metrics import aggregate, classify_kinds, compare_tensors, module_of, summarize


def _records(pairs):
    kinds = classify_kinds({n: tuple(a.shape) for n, (a, _) in pairs.items()})
    return [dict(compare_tensors(a, b), name=n, kind=kinds[n], module=module_of(n)) for n, (a, b) in pairs.items()]


def test_model_aggregate_matches_flat_concatenation():
    g = torch.Generator().manual_seed(0)
    pairs = {
        f"layer{i}.weight": (torch.randn(10 * (i + 1), generator=g), torch.randn(10 * (i + 1), generator=g))
        for i in range(4)
    }
    summary = summarize(_records(pairs))
    flat_a = torch.cat([a for a, _ in pairs.values()])
    flat_b = torch.cat([b for _, b in pairs.values()])
    whole = compare_tensors(flat_a, flat_b)
    for metric in ("max_abs_diff", "mean_abs_diff", "rms_diff", "rel_l2", "cosine"):
        assert summary[metric] == pytest.approx(whole[metric], rel=1e-12), metric
    # wasserstein aggregates as the numel-weighted mean of per-tensor distances (by design)
    per = [compare_tensors(a, b)["wasserstein"] * a.numel() for a, b in pairs.values()]
    assert summary["wasserstein"] == pytest.approx(sum(per) / flat_a.numel(), rel=1e-12)


def test_nonfinite_tensors_are_counted_not_averaged():
    pairs = {
        "a.weight": (torch.ones(4), torch.zeros(4)),
        "b.weight": (torch.tensor([float("nan")] * 4), torch.zeros(4)),
    }
    summary = summarize(_records(pairs))
    assert summary["tensors_nonfinite"] == 1 and summary["nonfinite_a"] == 4
    assert summary["max_abs_diff"] == 1.0 and not math.isnan(summary["wasserstein"])


@pytest.mark.parametrize(
    "name,shape,kind",
    [
        ("down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.weight", (32, 32), "attn_q"),
        ("down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight", (32, 64), "attn_k"),
        ("mid_block.attentions.0.transformer_blocks.0.attn1.to_v.weight", (32, 32), "attn_v"),
        ("mid_block.attentions.0.transformer_blocks.0.attn1.to_out.0.weight", (32, 32), "attn_out"),
        ("mid_block.attentions.0.transformer_blocks.0.attn1.to_out.0.bias", (32,), "attn_out"),
        ("text_model.encoder.layers.0.self_attn.q_proj.weight", (32, 32), "attn_q"),
        ("text_model.encoder.layers.0.self_attn.out_proj.bias", (32,), "attn_out"),
        ("encoder.layers.0.self_attn.in_proj_weight", (96, 32), "attn_qkv"),
        ("conv_in.weight", (32, 3, 3, 3), "conv"),
        ("conv_in.bias", (32,), "conv"),
        ("down_blocks.0.resnets.0.norm1.weight", (32,), "norm"),
        ("text_model.final_layer_norm.bias", (32,), "norm"),
        ("text_model.embeddings.token_embedding.weight", (260, 32), "embedding"),
        ("time_embedding.linear_1.weight", (128, 32), "linear"),
        ("time_embedding.linear_1.bias", (128,), "linear"),
        ("logit_scale", (), "other"),
        # attention output projections of other naming schemes; the MLP's c_proj stays a linear
        ("transformer.h.0.attn.c_proj.weight", (32, 32), "attn_out"),  # nanoGPT, GPT-2
        ("transformer.h.0.attn.c_proj.bias", (32,), "attn_out"),
        ("transformer.h.0.mlp.c_proj.weight", (32, 32), "linear"),
        ("model.layers.0.self_attn.o_proj.weight", (32, 32), "attn_out"),  # LLaMA
        ("blocks.0.attn.proj.weight", (32, 32), "attn_out"),  # timm ViT
        ("encoder.layer.0.attention.output.dense.weight", (32, 32), "attn_out"),  # BERT
        ("encoder.layer.0.output.dense.weight", (32, 32), "linear"),  # BERT's MLP
        ("down_blocks.0.attentions.0.proj_out.weight", (32, 32), "linear"),  # after the block, not in it
        ("down_blocks.0.attentions.0.transformer_blocks.0.ff.net.0.proj.weight", (32, 32), "linear"),
    ],
)
def test_kinds(name, shape, kind):
    shapes = {name: shape}
    if name.endswith("bias"):
        shapes[name[:-4] + "weight"] = (32, 3, 3, 3) if kind == "conv" else (32, 32)
    assert classify_kinds(shapes)[name] == kind


def test_group_by_module_and_kind():
    pairs = {
        "blk.attn.to_q.weight": (torch.ones(2, 2), torch.zeros(2, 2)),
        "blk.attn.to_q.bias": (torch.ones(2), torch.ones(2)),
        "blk.conv.weight": (torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2) * 3),
    }
    records = _records(pairs)
    by_module = {r["group"]: r for r in aggregate(records, "module")}
    assert set(by_module) == {"blk.attn.to_q", "blk.conv"}
    assert by_module["blk.attn.to_q"]["tensors"] == 2 and by_module["blk.attn.to_q"]["numel"] == 6
    assert by_module["blk.conv"]["max_abs_diff"] == 2.0
    by_kind = {r["group"]: r for r in aggregate(records, "kind")}
    assert set(by_kind) == {"attn_q", "conv"}
    assert aggregate(records, "model")[0]["max_abs_diff"] == 2.0
    with pytest.raises(ValueError, match="not one of"):
        aggregate(records, "layer")
