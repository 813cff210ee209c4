"""Pair recipes: shipped pairs resolve, variants apply to one arm, bad pairs are clear errors."""

from pathlib import Path

import pytest

from divergence.errors import RecipeError
from divergence.variants.pair_recipe import load_pair_recipe
from divergence.variants import VARIANTS, Variant

PAIRS = Path(__file__).resolve().parents[2] / "recipes" / "pairs"


@pytest.mark.parametrize(
    "name,category,field,a,b",
    [
        ("flash-vs-baseline", "optimization", lambda r: r.attention.name, "sdpa-flash", "baseline"),
        ("seed-vs-seed", "seed", lambda r: r.model.seed, 0, 1),
        ("fp16-vs-fp32", "precision", lambda r: r.train.precision, "16-mixed", "32-true"),
        ("bf16-vs-fp32", "precision", lambda r: r.train.precision, "bf16-mixed", "32-true"),
        ("control", "control", lambda r: r.model.seed, 0, 0),
        ("gradient-checkpointing", "optimization", lambda r: r.model.gradient_checkpointing, True, False),
        ("fused-adamw", "optimization", lambda r: r.train.adamw_impl, "fused", "loop"),
        ("reordering", "reordering", lambda r: (r.train.accumulate, r.train.batch_size), (4, 4), (1, 16)),
    ],
)
def test_shipped_pairs(name, category, field, a, b):
    pair = load_pair_recipe(PAIRS / f"{name}.yaml")
    assert pair.category == category
    assert field(pair.arm_recipes["a"]) == a and field(pair.arm_recipes["b"]) == b
    # everything else is shared, data seed included
    assert pair.arm_recipes["a"].data == pair.arm_recipes["b"].data


def test_overrides_route_to_pair_or_base():
    pair = load_pair_recipe(PAIRS / "seed-vs-seed.yaml", ["train.max_steps=7", "tracking.every=3"])
    assert pair.tracking.every == 3
    assert pair.arm_recipes["a"].train.max_steps == pair.arm_recipes["b"].train.max_steps == 7


def _write(tmp_path, text):
    (tmp_path / "base.yaml").write_text("name: base\n")
    path = tmp_path / "pair.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text,message",
    [
        ("base: base.yaml\narms: {a: [{warp: 9}], b: []}", "arms.a[0]: unknown variant 'warp'; registered variants:"),
        ("base: base.yaml\narms: {a: [], b: []}", "arms a and b are identical"),
        ("base: base.yaml\ncontrol: true\narms: {a: [{seed: 3}], b: []}", "control: true but the arms differ"),
        ("base: base.yaml\narms: {a: [{seed: -1}], b: []}", "arms.a[0]: expected a non-negative integer seed"),
        ("base: base.yaml\narms: {a: [{precision: fp8}], b: []}", "'fp8' is not one of"),
        ("base: base.yaml\narms: {a: []}", "expected exactly two arms"),
        ("base: nowhere.yaml\narms: {a: [], b: []}", "base 'nowhere.yaml' not found"),
        ("arms: {a: [], b: []}", "missing key 'base'"),
        ("base: base.yaml\nflavour: x\narms: {a: [], b: []}", "unknown key 'flavour'"),
        ("base: base.yaml\narms: {a: [{seed: 1}, {seed: 2}], b: []}", "sets model.seed, which another variant"),
        ("base: base.yaml\ntracking: {every: 0}\narms: {a: [{seed: 1}], b: []}", "tracking.every: must be >= 1"),
        ("base: base.yaml\nrecipe: {train: {lr: -1}}\narms: {a: [{seed: 1}], b: []}", "lr"),
        (
            "base: base.yaml\nreordering: true\narms: {a: [{adamw-impl: fused}], b: [{attention: sdpa-flash}]}",
            "arms.b[0]: attention=sdpa-flash is not an fp32-equivalent transformation, and reordering: true",
        ),
        (
            "base: base.yaml\nreordering: yes please\narms: {a: [{seed: 1}], b: []}",
            "reordering: expected true or false",
        ),
        ("base: base.yaml\nreordering: true\ncontrol: true\narms: {a: [], b: []}", "a pair is one or the other"),
    ],
)
def test_bad_pairs(tmp_path, text, message):
    with pytest.raises(RecipeError, match=None) as err:
        load_pair_recipe(_write(tmp_path, text))
    assert message in str(err.value)


def test_variants_declare_whether_they_are_fp32_equivalent():
    from divergence.variants.registry import fp32_equivalent

    declared = sorted(name for name, cls in VARIANTS.items() if cls.fp32_equivalent)
    assert declared == [
        "adamw-impl",
        "compile",
        "cpu-threads",
        "data-parallel",
        "expert-grouped",
        "expert-loop",
        "expert-parallel",
        "fsdp",
        "fsdp-offload",
        "grad-accumulation",
        "gradient-checkpointing",
        "injected-bug",  # claimed, as the buggy DDP it stands for claims (tests/scaleout/test_parallel_rows.py)
        "tensor-parallel",
        "zero-1",
    ]
    assert fp32_equivalent({"a": ["grad-accumulation=4x4"], "b": ["grad-accumulation=1x16"]})
    assert fp32_equivalent({"a": ["compile"], "b": ["compile=False"]})
    assert not fp32_equivalent({"a": ["compile", "precision=bf16-mixed"], "b": []})  # one is not
    assert not fp32_equivalent({"a": ["attention=flash"], "b": ["attention=sdpa"]})  # a registered one that is not
    assert not fp32_equivalent({"a": ["my-ddp"], "b": []}) and not fp32_equivalent({})  # unknown labels, none


def test_registry_is_open_for_new_variants():
    class Dropout(Variant):
        name = "test-dropout"

        def overrides(self):
            return {"train.weight_decay": 0.5}

    VARIANTS[Dropout.name] = Dropout
    try:
        assert load_pair_recipe_from_specs([Dropout.name]).arm_recipes["a"].train.weight_decay == 0.5
    finally:
        del VARIANTS[Dropout.name]


def load_pair_recipe_from_specs(specs, tmp=Path("/tmp")):
    import tempfile

    folder = Path(tempfile.mkdtemp())
    return load_pair_recipe(_write(folder, f"base: base.yaml\narms: {{a: {specs}, b: []}}"))
