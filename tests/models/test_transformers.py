"""Transformer backbones (PixArt, SD3 joint attention): variants reach every attention module,
each CPU kernel trains, the joint processor is diffusers' own with our kernel, a control is zero."""

import pytest
import torch

from divergence.attention.joint import KernelJointAttnProcessor
from divergence.attention.kernels import available_kernels, get_kernel
from divergence.attention.processor import KernelAttnProcessor
from divergence.attention.shadow import ShadowJointAttnProcessor, ShadowRecorder
from divergence.checkpoints.compare import compare_state_dicts
from divergence.errors import RecipeError, UserInputError
from divergence.metrics import classify_kinds
from divergence.models.attention import apply_attention, attention_modules
from divergence.models.denoiser import TransformerDenoiser
from divergence.recipe.model import AttentionConfig
from tests.training.tiny import ready_arm, tiny_recipe

CPU_KERNELS = available_kernels("cpu", torch.float32, head_dim=16)
KINDS = ("pixart", "sd3")
# Tiny defaults, 2 blocks: PixArt has a self- (attn1) and a cross-attention (attn2) per block;
# SD3 one joint attention per block.
MODULES = {"pixart": 4, "sd3": 2}


def _arm(kind, *overrides, recorder=None):
    return ready_arm("model.denoiser=transformer", f"model.transformer.kind={kind}", *overrides, recorder=recorder)


def test_cpu_runs_the_portable_kernels():
    assert {"baseline", "sdpa", "sdpa-math", "tiled"} <= set(CPU_KERNELS)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", [*CPU_KERNELS, "shadow"])
def test_each_cpu_variant_reaches_every_attention_module_and_trains(kind, name):
    arm, inputs = _arm(kind, f"attention.name={name}")
    assert isinstance(arm.unet, TransformerDenoiser)
    modules = attention_modules(arm.unet)
    assert len(modules) == MODULES[kind]
    assert all(modules[n].processor is p for n, p in arm.processors.items()) and set(arm.processors) == set(modules)
    joint = kind == "sd3"
    for processor in arm.processors.values():
        assert isinstance(processor, KernelJointAttnProcessor) == joint
        assert processor.kernel.name == (name if name != "shadow" else "sdpa-flash")
    first = next(p for n, p in arm.unet.named_parameters() if "to_q" in n)
    before = first.detach().clone()
    out = arm.training_step(inputs.prepare(inputs.batches.batch(0)))
    assert torch.isfinite(out.loss) and not torch.equal(before, first)


def _sd3_attention(context_pre_only):
    from diffusers.models.attention_processor import Attention, JointAttnProcessor2_0

    torch.manual_seed(0)
    return Attention(
        query_dim=32,
        added_kv_proj_dim=32,
        dim_head=8,
        heads=4,
        out_dim=32,
        bias=True,
        context_pre_only=context_pre_only,
        processor=JointAttnProcessor2_0(),
        qk_norm="rms_norm",
        eps=1e-6,
    )


@pytest.mark.parametrize("context_pre_only", [False, True])
def test_joint_processor_is_diffusers_joint_attention_bitwise_with_sdpa(context_pre_only):
    from diffusers.models.attention_processor import JointAttnProcessor2_0

    attn = _sd3_attention(context_pre_only)
    x, c = torch.randn(2, 16, 32), torch.randn(2, 7, 32)
    expected = JointAttnProcessor2_0()(attn, x, c)
    got = KernelJointAttnProcessor(get_kernel("sdpa"))(attn, x, c)
    assert isinstance(expected, tuple) and len(got) == 2
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert torch.equal(KernelJointAttnProcessor("sdpa")(attn, x), JointAttnProcessor2_0()(attn, x))
    baseline = KernelJointAttnProcessor("baseline")(attn, x, c)  # another kernel: close, same shapes
    assert (baseline[0] - expected[0]).abs().max() < 1e-5 and baseline[1].shape == expected[1].shape


def test_joint_shadow_compares_the_joint_attention():
    attn, recorder = _sd3_attention(False), ShadowRecorder()
    attn.set_processor(ShadowJointAttnProcessor("sdpa", "baseline", recorder=recorder, layer_name="j"))
    x, c = torch.randn(2, 16, 32), torch.randn(2, 7, 32)
    out = attn(x, c)
    assert torch.equal(out[0], KernelJointAttnProcessor("sdpa")(attn, x, c)[0])
    stats = recorder.drain()["j"]
    assert stats["calls"] == 1 and 0.0 < stats["max_abs_diff"] < 1e-5


def test_shadow_on_sd3_records_every_joint_layer():
    recorder = ShadowRecorder()
    arm, inputs = _arm(
        "sd3", "attention.name=shadow", "attention.options={primary: sdpa, secondary: baseline}", recorder=recorder
    )
    assert all(isinstance(p, ShadowJointAttnProcessor) for p in arm.processors.values())
    arm.training_step(inputs.prepare(inputs.batches.batch(0)))
    stats = recorder.drain()
    assert set(stats) == set(attention_modules(arm.unet))
    assert all(0.0 <= s["max_abs_diff"] < 1e-4 for s in stats.values())


@pytest.mark.parametrize("kind", KINDS)
def test_control_arms_stay_bitwise_identical(kind):
    (a, inputs), (b, _) = _arm(kind, "attention.name=sdpa-math"), _arm(kind, "attention.name=sdpa-math")
    for step in range(2):
        batch = inputs.prepare(inputs.batches.batch(step))
        assert torch.equal(a.training_step(batch).loss, b.training_step(batch).loss)
    comparison = compare_state_dicts(a.weights(), b.weights())
    assert comparison.summary["max_abs_diff"] == 0.0 and comparison.summary["wasserstein"] == 0.0


def test_flux_attention_is_found_by_interface_and_refused_by_name():
    from diffusers import FluxTransformer2DModel

    flux = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=16,
        pooled_projection_dim=16,
        axes_dims_rope=(2, 2, 4),
    )
    modules = attention_modules(flux)
    assert len(modules) == 2  # FluxAttention is no diffusers Attention subclass, yet it is found
    with pytest.raises(UserInputError, match="transformer_blocks.0.attn.*FluxAttnProcessor"):
        apply_attention(flux, AttentionConfig(name="sdpa"))


def test_kinds_recognise_joint_attention_projections():
    arm, _ = _arm("sd3")
    shapes = {n: tuple(t.shape) for n, t in arm.unet.state_dict().items()}
    kinds = classify_kinds(shapes)
    block = "transformer.transformer_blocks.0.attn."
    assert [kinds[block + p + ".weight"] for p in ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")] == [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_out",
    ]
    assert kinds[block + "to_out.0.weight"] == "attn_out"


def test_plain_processors_on_pixart():
    arm, _ = _arm("pixart", "attention.name=baseline")
    assert all(type(p) is KernelAttnProcessor for p in arm.processors.values())
    assert {n.rsplit(".", 1)[-1] for n in arm.processors} == {"attn1", "attn2"}


@pytest.mark.parametrize(
    "override, key",
    [
        ("model.transformer.kind=flux", "model.transformer.kind"),
        ("model.denoiser=dit", "model.denoiser"),
        ("model.transformer.patch_size=3", "data.resolution"),
        ("model.transformer.head_dim=0", "model.transformer.head_dim"),
    ],
)
def test_bad_transformer_recipes_name_the_key(override, key):
    with pytest.raises(RecipeError, match=key.replace(".", r"\.")):
        tiny_recipe("model.denoiser=transformer", override)


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_checkpointing_reaches_the_transformer(kind):
    arm, inputs = _arm(kind, "model.gradient_checkpointing=true")
    assert arm.unet.is_gradient_checkpointing and arm.unet.transformer.is_gradient_checkpointing
    assert torch.isfinite(arm.training_step(inputs.prepare(inputs.batches.batch(0))).loss)


def test_shipped_dit_pair_and_study_recipes_load():
    from pathlib import Path

    from divergence.variants.pair_recipe import load_pair_recipe
    from divergence.study.config import load_study

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    pair = load_pair_recipe(recipes / "pairs" / "dit-flash-vs-baseline.yaml")
    assert pair.name == "dit-flash-vs-baseline"
    study = load_study(recipes / "study-dit.yaml")
    assert [p.role for p in study.pairs][0] == "study" and study.pairs[0].name == "dit-flash-vs-baseline"
    assert all(p.recipe["base"].endswith("tiny-dit.yaml") for p in study.pairs)
