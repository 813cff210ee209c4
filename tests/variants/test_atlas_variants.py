"""The atlas's variants: each takes effect (its arm differs from the reference arm after a step) and
each against itself is exactly zero on a CPU (the control)."""

import os

import pytest
import torch

from divergence.errors import RecipeError
from divergence.training.arm import Arm, regroup
from divergence.training.inputs import Inputs
from divergence.variants import parse_variant
from tests.pairs.helpers import pair_recipe
from tests.training.tiny import DIT, one_torch_thread  # noqa: F401  (fixture)

CPU = torch.device("cpu")
# the tiny test recipe, shrunk: batch 4 so 2x2 accumulation has a batch to split
SMALL = ("train.batch_size=4", "tracking.probe.enabled=false")


def _arms(pair, *names: str):
    """Arms of ``pair`` by arm name ("a", "b"; "a" twice for the control), set up on the CPU."""
    inputs = Inputs(pair.arm_recipes[names[0]])
    arms = []
    for name in names:
        arm = Arm(pair.arm_recipes[name], inputs.tokenizer, name=name)
        arm.setup(CPU)
        arm.configure_optimizers()
        for variant in pair.arms[name]:
            variant.verify(arm)
        arms.append(arm)
    return arms, inputs


def _step(arms, inputs, steps: int = 1):
    for step in range(steps):
        micro = inputs.prepare_step(inputs.batches.batch(step))
        for arm in arms:
            arm.training_step(micro)


def _max_difference(x: Arm, y: Arm) -> float:
    wx, wy = x.weights(), y.weights()
    return max(float((wx[k].double() - wy[k].double()).abs().max()) for k in wx)


# pair recipe -> overrides that make it a test (its deployment precision where it has one); on the DiT,
# the atlas's denoiser (a step ~3x cheaper), and flash-unbiased on the UNet's attention too. cpu-threads on
# the UNet cost ~19 s of CPU (its arm's 2 threads spin on 2 busy cores), a few seconds on the DiT
PAIRS = {
    "fp8-tensorwise on the DiT": ("train.precision=bf16-mixed", *DIT),
    "fp8-rowwise on the DiT": ("train.precision=bf16-mixed", *DIT),
    "int8-mixed on the DiT": DIT,
    "grad-accumulation on the DiT": ("arms.a=[{grad-accumulation: 2x2}]", "arms.b=[{grad-accumulation: 1x4}]", *DIT),
    "cpu-threads on the DiT": DIT,
    "flash-unbiased": ("train.precision=bf16-mixed",),
    "flash-unbiased on the DiT": ("train.precision=bf16-mixed", *DIT),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_the_variant_takes_effect_and_against_itself_is_exactly_zero(name):
    pair = pair_recipe(name.split(" on the ")[0], *SMALL, *PAIRS[name])
    (a, b, a2), inputs = _arms(pair, "a", "b", "a")
    assert _max_difference(a, b) == 0.0  # the same initial weights
    _step([a, b, a2], inputs)
    assert _max_difference(a, b) > 0.0, f"{name}: arm a computes what arm b does"
    assert _max_difference(a, a2) == 0.0, f"{name}: the variant against itself is not exactly zero"


def test_fp8_converts_only_linear_layers_whose_dimensions_are_multiples_of_16(capsys):
    pair = pair_recipe("fp8-rowwise", *SMALL, "train.precision=bf16-mixed")
    (a,), _ = _arms(pair, "a")
    said = capsys.readouterr().err
    assert "fp8 rowwise:" in said and "(emulated)" in said
    converted = set(a.optimized["fp8_layers"])
    linears = {f"unet.{n}": m for n, m in a.unet.named_modules() if isinstance(m, torch.nn.Linear)}
    assert f"{len(converted)} linear layers in FP8" in said
    assert linears and set(linears) >= {n for n in converted if n.startswith("unet.")}
    for name, module in linears.items():
        divisible = module.in_features % 16 == 0 and module.out_features % 16 == 0
        assert (name in converted) == divisible, name
        assert (name in said) == (not divisible), name  # the line names the layers left out


def test_fp8_with_no_convertible_layer_is_a_clear_error():
    from divergence.variants.optimizations import FP8

    class Bare:
        unet, text_encoder, train_text_encoder, optimized = torch.nn.Linear(3, 5), None, False, None

    with pytest.raises(RuntimeError, match="no linear layer converted .*multiples of 16"):
        FP8("tensorwise", "t").verify(Bare())


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"fp8": "blockwise"}, "one of tensorwise, rowwise"),
        ({"grad-accumulation": "4"}, "expected KxB"),
        ({"grad-accumulation": "0x16"}, "expected KxB"),
        ({"cpu-threads": 0}, "positive number of threads"),
        ({"compile": "yes"}, "true or false"),
        ({"int8-mixed": 1}, "true or false"),
    ],
)
def test_bad_values_name_the_key(spec, message):
    with pytest.raises(RecipeError, match=f"arms.a\\[0\\]: .*{message}"):
        parse_variant(spec, "arms.a[0]")


def test_a_missing_torchao_is_one_line_naming_the_extra(monkeypatch):
    from divergence import extras
    from divergence.extras import MissingExtra

    monkeypatch.setattr(extras, "installed", lambda module: module != "torchao")
    with pytest.raises(MissingExtra, match=r"needs torchao .* pip install 'divergence\[fp8\]'"):
        parse_variant({"fp8": "rowwise"}, "arms.a[0]")
    with pytest.raises(MissingExtra, match=r"pip install 'divergence\[int8\]'"):
        parse_variant("int8-mixed", "arms.a[0]")


def test_regroup_splits_and_joins_the_same_examples_in_order():
    recipe = pair_recipe(
        "grad-accumulation", *SMALL, "arms.a=[{grad-accumulation: 2x2}]", "arms.b=[{grad-accumulation: 1x4}]"
    ).arm_recipes["a"]
    inputs = Inputs(recipe)
    micro = inputs.prepare_step(inputs.batches.batch(0))
    (whole,) = regroup(micro, 1)
    assert whole.noisy.shape[0] == 4 and torch.equal(whole.noisy[:2], micro[0].noisy)
    again = regroup([whole], 2)
    assert all(torch.equal(x.target, y.target) and torch.equal(x.input_ids, y.input_ids) for x, y in zip(again, micro))
    with pytest.raises(RuntimeError, match="accumulate=3 does not divide the step's 4 examples"):
        regroup(micro, 3)


def test_compile_compiles_the_denoiser_in_place_keeping_its_weight_names():
    pair = pair_recipe("compile", *SMALL)
    (a, b), _ = _arms(pair, "a", "b")  # verify: arm a's denoiser compiled, arm b's not (nothing runs yet)
    assert a.optimized["compiled"] and not b.optimized["compiled"]
    assert list(a.weights()) == list(b.weights())  # checkpoints and the store keep their tensor names


# The first inductor compile of the tiny UNet took 4.4 min of CPU (8.7 min wall) on the shared 2-core
# machine, 46 s with a warm cache: too slow for the suite, so opt in.
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("DIVERGENCE_COMPILE_TESTS"), reason="set DIVERGENCE_COMPILE_TESTS=1 (minutes)")
def test_compile_takes_effect_and_against_itself_is_exactly_zero():
    pair = pair_recipe("compile", *SMALL)
    (a, b, a2), inputs = _arms(pair, "a", "b", "a")
    _step([a, b, a2], inputs)
    assert _max_difference(a, b) > 0.0 and _max_difference(a, a2) == 0.0


def test_torchao_imports_without_its_cuda_kernel_warnings():
    """On a CPU build torchao says "Failed to load ..._C_mxfp8.so" at import (kernels the FP8 and
    INT8 training here never calls), and diffusers imports it in every run."""
    import subprocess
    import sys

    code = "import divergence, torchao.float8, diffusers.quantizers.auto"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    for noise in ("Failed to load", "register_constant", "Unable to import `torchao`"):
        assert noise not in run.stderr, run.stderr
