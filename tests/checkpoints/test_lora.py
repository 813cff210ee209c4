"""`compare` on peft LoRA adapter folders: the effective weight change (alpha/r) B A per layer,
equal to what merging the adapters gives, and blind to the factors' non-uniqueness."""

import copy
import json

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file

from divergence.checkpoints import open_checkpoint
from divergence.cli import main
from divergence.checkpoints.compare import compare_checkpoints
from divergence.errors import CheckpointError
from divergence.metrics import compare_tensors
from divergence.models.denoiser import build_transformer
from divergence.recipe.model import TransformerConfig

TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
RANK = 4


def _base():
    return build_transformer(TransformerConfig(kind="pixart", num_layers=1), 3, 8, 16, seed=0)


def _adapter(folder, seed, alpha=8.0):
    """A real peft adapter on a tiny PixArt transformer, B random (peft starts it at zero)."""
    model = get_peft_model(_base(), LoraConfig(r=RANK, lora_alpha=alpha, target_modules=TARGETS))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    model.save_pretrained(folder)
    return model


def _merged_change(peft_model) -> dict[str, torch.Tensor]:
    """By hand, through peft's own merge: W_merged - W_base for every adapted layer."""
    base = _base().state_dict()
    merged = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    return {k: merged[k] - base[k] for k in base if k.endswith(".weight") and not torch.equal(merged[k], base[k])}


@pytest.fixture()
def adapters(tmp_path):
    a, b = _adapter(tmp_path / "a", 1), _adapter(tmp_path / "b", 2)
    return tmp_path, a, b


def test_records_are_the_merged_weight_change(adapters):
    folder, a, b = adapters
    result = compare_checkpoints(folder / "a", folder / "b")
    change_a, change_b = _merged_change(a), _merged_change(b)
    assert len(result.records) == len(change_a) == 8  # q, k, v, out of attn1 and attn2 in the one block
    for record in result.records:
        assert record["name"].endswith(".lora_delta")
        weight = record["name"].removesuffix(".lora_delta") + ".weight"
        expected = compare_tensors(change_a[weight], change_b[weight])
        for metric in ("max_abs_diff", "mean_abs_diff", "rms_diff", "wasserstein", "rel_l2", "cosine"):
            assert record[metric] == pytest.approx(expected[metric], rel=1e-4, abs=1e-7), (record["name"], metric)
    assert {r["kind"] for r in result.records} == {"attn_q", "attn_k", "attn_v", "attn_out"}


def test_difference_metrics_equal_those_of_the_merged_weights(adapters):
    folder, a, b = adapters
    merged_a = copy.deepcopy(a).merge_and_unload().state_dict()
    merged_b = copy.deepcopy(b).merge_and_unload().state_dict()
    for record in compare_checkpoints(folder / "a", folder / "b").records:
        weight = record["name"].removesuffix(".lora_delta") + ".weight"
        expected = compare_tensors(merged_a[weight], merged_b[weight])  # W cancels in the difference
        assert record["max_abs_diff"] == pytest.approx(expected["max_abs_diff"], rel=1e-4)
        assert record["rms_diff"] == pytest.approx(expected["rms_diff"], rel=1e-4)


def test_a_reparametrised_adapter_compares_as_identical(adapters):
    folder, _, _ = adapters
    twin = folder / "twin"
    twin.mkdir()
    (twin / "adapter_config.json").write_text((folder / "a" / "adapter_config.json").read_text())
    factors = load_file(str(folder / "a" / "adapter_model.safetensors"))
    gen = torch.Generator().manual_seed(3)
    out = {}
    for name, tensor in factors.items():
        if ".lora_A." in name:
            # R: a random well-conditioned (r, r) matrix; (B R)(R^-1 A) = B A
            q, _ = torch.linalg.qr(torch.randn(RANK, RANK, generator=gen, dtype=torch.float64))
            r = q @ torch.diag(torch.linspace(0.5, 2.0, RANK, dtype=torch.float64))
            b_name = name.replace(".lora_A.", ".lora_B.")
            out[name] = (torch.linalg.inv(r) @ tensor.double()).float()
            out[b_name] = (factors[b_name].double() @ r).float()
    save_file(out, str(twin / "adapter_model.safetensors"))
    raw = compare_checkpoints(folder / "a" / "adapter_model.safetensors", twin / "adapter_model.safetensors")
    assert raw.summary["max_abs_diff"] > 0.1  # the factors differ a lot ...
    effective = compare_checkpoints(folder / "a", twin)
    assert effective.summary["max_abs_diff"] < 1e-5 and effective.summary["cosine"] == pytest.approx(1.0)  # ... B A not


def test_scale_is_alpha_over_rank(tmp_path):
    _adapter(tmp_path / "a", 1, alpha=4.0)
    _adapter(tmp_path / "b", 1, alpha=8.0)  # the same factors, twice the scale
    a, b = open_checkpoint(tmp_path / "a"), open_checkpoint(tmp_path / "b")
    for name in a.names:
        torch.testing.assert_close(b.load(name), 2 * a.load(name))
    factors = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))
    name = next(n for n in factors if ".lora_A." in n)
    delta = a.load(name.removeprefix("base_model.model.").replace(".lora_A.weight", ".lora_delta"))
    torch.testing.assert_close(delta, (4.0 / RANK) * factors[name.replace(".lora_A.", ".lora_B.")] @ factors[name])


def test_compare_says_it_compares_the_effective_change(adapters, capsys):
    folder, _, _ = adapters
    assert main(["compare", str(folder / "a"), str(folder / "b")]) == 0
    out = capsys.readouterr().out
    assert "effective weight change delta_W = (alpha/r) B A" in out and "lora_delta" in out


def test_broken_adapters_name_the_file(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "use_dora": True}))
    with pytest.raises(CheckpointError, match="adapter_config.json.*DoRA"):
        open_checkpoint(bad)
    (bad / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    with pytest.raises(CheckpointError, match="no adapter_model.safetensors"):
        open_checkpoint(bad)
    save_file({"x.lora_A.weight": torch.zeros(4, 3)}, str(bad / "adapter_model.safetensors"))
    with pytest.raises(CheckpointError, match="'x' has only one"):
        open_checkpoint(bad)
