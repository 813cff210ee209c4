"""Attention variants: applied to one model by name, verified, and each trains a step on the CPU."""

import pytest
import torch

from divergence.attention.kernels import available_kernels
from divergence.attention.shadow import ShadowRecorder
from divergence.errors import RecipeError, UserInputError
from divergence.models.attention import attention_modules, verify_attention
from divergence.recipe.model import AttentionConfig
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs
from tests.training.tiny import ready_arm, tiny_recipe

CPU = torch.device("cpu")
# The tiny UNet's smallest head dim: 32 channels / 4 heads.
CPU_KERNELS = available_kernels("cpu", torch.float32, head_dim=8)
# Tiny UNet: 2 down + 1 mid + 4 up transformer blocks, each a self- and a cross-attention.
ATTENTION_MODULES = 14


_arm = ready_arm


def test_cpu_runs_the_portable_kernels():
    assert {"baseline", "sdpa", "sdpa-math", "tiled"} <= set(CPU_KERNELS)


@pytest.mark.parametrize("name", CPU_KERNELS)
def test_each_cpu_variant_trains_a_step(name):
    arm, inputs = _arm(f"attention.name={name}")
    processors = {n: m.processor for n, m in attention_modules(arm.unet).items()}
    assert len(processors) == ATTENTION_MODULES and all(p.kernel.name == name for p in processors.values())
    before = arm.unet.conv_in.weight.detach().clone()
    out = arm.training_step(inputs.prepare(inputs.batches.batch(0)))
    assert torch.isfinite(out.loss) and not torch.equal(before, arm.unet.conv_in.weight)


def test_tiled_takes_its_options():
    arm, _ = _arm("attention.name=tiled", "attention.options={block_q: 16, block_kv: 32, block_order: swapped}")
    kernel = next(iter(arm.processors.values())).kernel
    assert kernel.options["block_q"] == 16 and kernel.options["block_order"] == "swapped"


def test_shadow_records_per_layer_deviation_while_training():
    recorder = ShadowRecorder()
    arm, inputs = _arm(
        "attention.name=shadow", "attention.options={primary: sdpa, secondary: baseline}", recorder=recorder
    )
    arm.training_step(inputs.prepare(inputs.batches.batch(0)))
    stats = recorder.drain()
    assert set(stats) == set(attention_modules(arm.unet))
    assert all(0.0 <= s["max_abs_diff"] < 1e-4 for s in stats.values())


def test_bad_options_and_names_are_recipe_errors():
    with pytest.raises(RecipeError, match="attention.name 'tiled'.*block_z"):
        _arm("attention.name=tiled", "attention.options={block_z: 3}")
    with pytest.raises(RecipeError, match="attention.options.colour"):
        _arm("attention.name=shadow", "attention.options={colour: red}")


def test_variant_the_device_cannot_run_fails_at_setup():
    recipe = tiny_recipe("attention.name=sdpa-efficient")
    arm = Arm(recipe, Inputs(recipe).tokenizer)
    with pytest.raises(UserInputError, match="attention.name 'sdpa-efficient'.*cpu"):
        arm.setup(CPU)


def test_applied_per_model_not_process_wide():
    a, _ = _arm("attention.name=baseline")
    b, _ = _arm("attention.name=sdpa-math")
    assert {p.kernel.name for p in a.processors.values()} == {"baseline"}
    assert {p.kernel.name for p in b.processors.values()} == {"sdpa-math"}


def test_verify_fails_loudly_when_a_module_lost_its_processor():
    from diffusers.models.attention_processor import AttnProcessor

    arm, _ = _arm()
    name, module = next(iter(attention_modules(arm.unet).items()))
    module.set_processor(AttnProcessor())
    with pytest.raises(RuntimeError, match=f"1 of {ATTENTION_MODULES} attention modules.*{name}"):
        verify_attention(arm.unet, arm.processors)


def test_a_model_without_attention_is_an_error():
    with pytest.raises(UserInputError, match="no attention modules"):
        _arm(
            "model.unet.down_block_types=[DownBlock2D,DownBlock2D,DownBlock2D]",
            "model.unet.up_block_types=[UpBlock2D,UpBlock2D,UpBlock2D]",
            "model.unet.mid_block=false",
        )


def test_attention_config_rejects_empty_name():
    with pytest.raises(RecipeError, match="name"):
        AttentionConfig(name=" ")
