"""The signed error of the microbenchmark: the bias z-score, the tie-heavy inputs, the gradient columns."""

import math

import torch

from divergence.microbench.config import InputsConfig, load_recipe
from divergence.microbench.inputs import make_grad_output, make_inputs
from divergence.microbench.metrics import signed_stats
from divergence.microbench.scales import parse_dist
from divergence.microbench.sweep import COLUMNS, SIGNED, plan, run_sweep


def _round_up(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to bf16 toward +inf: the nearest bf16 at or above each value."""
    r = x.to(torch.bfloat16)
    below = r.double() < x
    return torch.where(below, torch.nextafter(r, torch.full_like(r, math.inf)), r).double()


def _truncate(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to bf16 toward zero (truncation)."""
    r = x.to(torch.bfloat16)
    away = r.double().abs() > x.abs()
    return torch.where(away, torch.nextafter(r, torch.zeros_like(r)), r).double()


def test_the_bias_z_score_separates_a_biased_rounding_from_round_to_nearest_even():
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    nearest = signed_stats(x.to(torch.bfloat16), x)
    up = signed_stats(_round_up(x), x)
    truncated = signed_stats(_truncate(x.abs() + 0.5), x.abs() + 0.5)  # positive data: always toward -inf
    assert abs(nearest["bias_z"]) < 4 and nearest["rel_bias"] < 0.05
    assert 0.45 < nearest["majority_sign_frac"] < 0.55
    for biased, sign in ((up, 1), (truncated, -1)):
        assert sign * biased["bias_z"] > 30 and biased["rel_bias"] > 0.5
        assert biased["majority_sign_frac"] == 1.0
    assert math.isnan(signed_stats(x, x)["bias_z"])  # no error: no bias to speak of


def test_the_standard_error_is_over_independent_slices_when_there_are_enough():
    g = torch.Generator().manual_seed(1)
    offsets = torch.randn(16, 1, 1, generator=g, dtype=torch.float64)  # one shared error per slice
    err = offsets + 1e-3 * torch.randn(16, 64, 8, generator=g, dtype=torch.float64)
    ref = torch.zeros_like(err)
    by_rows, by_slices = signed_stats(err, ref), signed_stats(err, ref, units=16)
    assert by_rows["se_units"] == 16 * 64 and by_slices["se_units"] == 16
    assert by_slices["se_signed"] > 5 * by_rows["se_signed"]  # correlated rows understate the SE, inflate z
    assert abs(by_slices["bias_z"]) < 4  # zero-mean slice offsets: no bias
    assert signed_stats(err, ref, units=4)["se_units"] == 16 * 64  # too few slices: rows


def _ties_per_row(q, k) -> torch.Tensor:
    """Scores per query row exactly equal to the row's maximum (bf16 inputs, fp32 products)."""
    s = q.float() @ k.float().transpose(-2, -1)
    return (s == s.amax(dim=-1, keepdim=True)).sum(dim=-1)


def test_the_tie_heavy_inputs_tie_at_the_row_maximum_and_the_gaussian_ones_do_not():
    cfg = InputsConfig(heads=2, head_dim=32)
    q, k, v = make_inputs(cfg, 256, dist=parse_dist("ties:1:16"))
    ties = _ties_per_row(q, k)
    assert int(ties.min()) >= 2 and float(ties.double().mean()) > 8  # about 256 / 16 copies of the best key
    assert len(torch.unique(k[0, 0], dim=0)) == 16
    assert float((v < 0).double().mean()) > 0.75  # V ~ N(-1, 1): mostly negative
    for x in (q, k, v):  # exact in every format, as the other inputs
        assert torch.equal(x.to(torch.bfloat16).double(), x) and torch.equal(x.half().double(), x)
    q, k, _ = make_inputs(cfg, 256, dist=parse_dist("normal:1"))
    assert float((_ties_per_row(q, k) > 1).double().mean()) < 0.02
    assert parse_dist("ties").spec == "ties:1:16" and parse_dist("ties:0.5").spec == "ties:0.5:16"


def test_every_row_carries_the_signed_error_forward_and_backward():
    recipe = load_recipe(
        None,
        [
            "sweep.precisions=[bf16]",
            "sweep.seq_lens=[64, 128]",
            "sweep.reference_seq_len=128",
            "sweep.backward_max_seq_len=64",
            "sweep.impls=[baseline, flash, flash-unbiased]",
            "inputs.scales=[ties]",
            "inputs.head_dim=16",
            "tiles.block_sizes=[32]",
            "tiles.orders=[default]",
        ],
    )
    rows, _ = run_sweep(recipe, plan(recipe)[0], progress=False)
    assert set(SIGNED) <= set(COLUMNS)
    impls = {(r["impl"], r["input_dist"]) for r in rows}
    assert ("flash-unbiased", "ties:1:16") in impls and ("flash-unbiased", "normal:1") in impls
    for r in rows:
        assert math.isfinite(r["bias_z"]) and 0 <= r["rel_bias"] <= 1
        if r["seq_len"] == 64:
            assert all(math.isfinite(r[f"{g}_bias_z"]) and r[f"{g}_max_abs_err"] > 0 for g in ("dq", "dk", "dv"))
        else:
            assert "dq_bias_z" not in r  # longer than sweep.backward_max_seq_len: the cells stay empty
    dout = make_grad_output(recipe.inputs, 64)
    assert dout.shape == (1, 2, 64, 16) and torch.equal(dout.to(torch.bfloat16).double(), dout)


def test_the_low_rank_inputs_have_similar_rows_tied_scores_and_a_similar_output_gradient():
    cfg = InputsConfig(heads=2, head_dim=64)
    dist = parse_dist("lowrank")
    q, k, v = make_inputs(cfg, 256, dist=dist)
    dout = make_grad_output(cfg, 256, dist=dist)
    for x in (q, k, dout):  # one shared row per head plus 1% noise: every row nearly the shared one
        centred = x - x.mean(dim=-2, keepdim=True)
        assert centred.square().mean() < 0.001 * x.square().mean()
    assert (v.mean(dim=-2) < 0).double().mean() > 0.7  # V's shared row shifted to mostly negative
    s = (q.to(torch.bfloat16) @ k.to(torch.bfloat16).transpose(-2, -1)).float() / 8
    tied = (s >= s.amax(dim=-1, keepdim=True) - 1e-3).sum(dim=-1)
    assert tied.double().mean() > 2  # several scores of a row at its maximum, in bf16
    normal = make_grad_output(cfg, 256)
    assert (normal - normal.mean(dim=-2, keepdim=True)).square().mean() > 0.9  # other inputs: dO as before


def test_delta_is_rowsum_of_the_output_gradient_times_the_output_error():
    from divergence.microbench.sweep import _delta_columns

    gold = torch.zeros(1, 8, 4, 2, dtype=torch.float64)
    out = gold + 2.0**-8  # every output element errs up by one amount
    dout = torch.ones_like(gold)
    cols = _delta_columns(out.to(torch.bfloat16), gold, dout)
    assert cols["delta_mean_signed_err"] == 2 * 2.0**-8 and cols["delta_rel_bias"] == 1.0
    assert {f"delta_{c}" for c in ("bias_z", "max_abs_err", "majority_sign_frac")} <= set(COLUMNS)
