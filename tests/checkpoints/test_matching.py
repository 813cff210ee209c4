"""Matching tensors across checkpoints: wrapper prefixes, --map, mismatches."""

import pytest
import torch

from divergence.checkpoints import match_tensors
from divergence.checkpoints.source import InMemorySource
from divergence.errors import CheckpointError, UserInputError


def _src(names, shape=(2,)):
    return InMemorySource("mem", {n: torch.zeros(shape) for n in names})


def test_lightning_and_ddp_prefixes_are_stripped():
    a = _src(["model.unet.conv.weight", "model.unet.conv.bias"])
    b = _src(["module.unet.conv.weight", "module.unet.conv.bias"])
    m = match_tensors(a, b)
    assert sorted(n for n, _, _ in m.pairs) == ["unet.conv.bias", "unet.conv.weight"]
    assert m.stripped_a == "model." and m.stripped_b == "module."


def test_compile_and_fsdp_wrappers_anywhere():
    a = _src(["_orig_mod.blk._fsdp_wrapped_module.lin.weight"])
    b = _src(["blk._checkpoint_wrapped_module.lin.weight"])
    m = match_tensors(a, b)
    assert m.pairs == [
        ("blk.lin.weight", "_orig_mod.blk._fsdp_wrapped_module.lin.weight", "blk._checkpoint_wrapped_module.lin.weight")
    ]
    assert (m.stripped_a, m.stripped_b) == ("_orig_mod._fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def test_a_compiled_models_orig_mod_is_reported_like_a_prefix(tmp_path, capsys):
    from safetensors.torch import save_file

    from divergence.cli import main

    weights = {"conv.weight": torch.ones(2, 2), "conv.bias": torch.zeros(2)}
    save_file({f"_orig_mod.{k}": v for k, v in weights.items()}, tmp_path / "compiled.safetensors")
    save_file(weights, tmp_path / "eager.safetensors")
    assert main(["compare", str(tmp_path / "compiled.safetensors"), str(tmp_path / "eager.safetensors")]) == 0
    assert "matched after stripping '_orig_mod.' from A" in capsys.readouterr().out


def test_component_prefix_against_bare_names():
    a = _src(["unet.conv.weight", "unet.norm.weight"])
    b = _src(["conv.weight", "norm.weight"])
    assert len(match_tensors(a, b).pairs) == 2


def test_identical_prefixes_are_kept():
    a = _src(["model.x.weight"])
    m = match_tensors(a, _src(["model.x.weight"]))
    assert m.pairs[0][0] == "model.x.weight"


def test_map_renames():
    a = _src(["attn.q.weight", "attn.k.weight"])
    b = _src(["attn.to_q.weight", "attn.to_k.weight"])
    with pytest.raises(CheckpointError, match="2 only in"):
        match_tensors(a, b)
    m = match_tensors(a, b, maps=[r"\.to_(q|k)\.=.\1."])
    assert len(m.pairs) == 2


def test_bad_map_rules():
    a = b = _src(["x.weight"])
    with pytest.raises(UserInputError, match="expected PATTERN=REPLACEMENT"):
        match_tensors(a, b, maps=["nope"])
    with pytest.raises(UserInputError, match="not a valid regular expression"):
        match_tensors(a, b, maps=["(=x"])
    with pytest.raises(UserInputError, match="renames both"):
        match_tensors(_src(["x.a", "x.b"]), b, maps=[r"x\.[ab]=same"])


def test_mismatch_lists_first_few_and_count():
    a = _src([f"layer{i}.weight" for i in range(9)] + ["shared.weight"])
    b = _src(["shared.weight", "extra.weight"])
    with pytest.raises(CheckpointError) as err:
        match_tensors(a, b)
    message = str(err.value)
    assert "9 only in" in message and "... 4 more" in message and "1 only in" in message
    assert "--intersection" in message


def test_shape_mismatch_and_intersection():
    a = InMemorySource("a", {"w": torch.zeros(2, 3), "v": torch.zeros(2), "only_a": torch.zeros(1)})
    b = InMemorySource("b", {"w": torch.zeros(3, 2), "v": torch.zeros(2)})
    with pytest.raises(CheckpointError, match=r"w \[2, 3\] vs \[3, 2\]"):
        match_tensors(a, b)
    m = match_tensors(a, b, intersection=True)
    assert [p[0] for p in m.pairs] == ["v"]
    reasons = {s["name"]: s["reason"] for s in m.skipped}
    assert reasons == {"only_a": "only in A", "w": "shape [2, 3] in A, [3, 2] in B"}


def test_nothing_in_common_is_an_error_even_with_intersection():
    with pytest.raises(CheckpointError, match="no tensor names in common"):
        match_tensors(_src(["a.weight", "b.weight"]), _src(["c.bias", "d.bias"]), intersection=True)


@pytest.mark.parametrize("order", [("w", "_orig_mod.w"), ("_orig_mod.w", "w")])
def test_two_names_that_lose_a_wrapper_into_one_are_refused_in_either_order(tmp_path, capsys, order):
    """``w`` and ``_orig_mod.w`` in one file: before, the last in key order silently won."""
    from safetensors.torch import save_file

    from divergence.cli import main

    values = {"w": torch.zeros(2), "_orig_mod.w": torch.ones(2)}
    a = _src(order)
    with pytest.raises(CheckpointError, match="holds both .* same tensor 'w'"):
        match_tensors(a, _src(["w"]))
    save_file({name: values[name] for name in order}, str(tmp_path / "a.safetensors"))
    save_file({"w": torch.zeros(2)}, str(tmp_path / "b.safetensors"))
    assert main(["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a.safetensors" in err[0] and "'_orig_mod.w'" in err[0]
