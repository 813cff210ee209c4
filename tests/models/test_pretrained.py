"""Pretrained parts: save_pretrained folders (subfolder, variant) and hub ids under HF_HUB_OFFLINE,
and a pair whose two arms start from the same saved weights. Nothing downloads."""

import pytest
import torch
from safetensors.torch import load_file

from divergence.errors import RecipeError, UserInputError
from divergence.models.build import build_unet, check_local_paths
from divergence.models.denoiser import build_transformer
from divergence.recipe.model import ModelConfig, TransformerConfig, UNetConfig
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs
from divergence.training.lockstep import train_pair
from tests.pairs.helpers import pair_recipe
from tests.training.tiny import tiny_recipe


def _arm(*overrides):
    recipe = tiny_recipe(*overrides)
    return Arm(recipe, Inputs(recipe).tokenizer)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A pipeline-like folder: unet/ (fp16-named variant), transformer/ and text_encoder/, each
    written by save_pretrained from a seed that no recipe below uses."""
    root = tmp_path_factory.mktemp("pretrained")
    unet = _arm("model.seed=7")
    unet.unet.save_pretrained(root / "unet", variant="v1")
    unet.text_encoder.save_pretrained(root / "text_encoder")
    sd3 = _arm("model.seed=7", "model.denoiser=transformer", "model.transformer.kind=sd3")
    sd3.unet.transformer.save_pretrained(root / "transformer")
    return root, unet, sd3


def _equal(module, saved_module):
    mine, theirs = module.state_dict(), saved_module.state_dict()
    return mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_every_part_loads_from_a_saved_folder_with_subfolder_and_variant(saved):
    root, unet, sd3 = saved
    arm = _arm(
        f"model.unet.path={root}",
        "model.unet.subfolder=unet",
        "model.unet.variant=v1",
        f"model.text_encoder.path={root / 'text_encoder'}",
    )
    assert _equal(arm.unet, unet.unet) and _equal(arm.text_encoder, unet.text_encoder)
    arm = _arm(
        "model.denoiser=transformer",
        "model.transformer.kind=sd3",
        f"model.transformer.path={root}",
        "model.transformer.subfolder=transformer",
    )
    assert _equal(arm.unet.transformer, sd3.unet.transformer)
    assert not _equal(arm.text_encoder, sd3.text_encoder)  # model.seed=0 here: only the path loads


def test_wrong_variant_or_subfolder_names_the_key(saved):
    root, _, _ = saved
    with pytest.raises(UserInputError, match="model.unet.path.*variant"):
        build_unet(UNetConfig(path=str(root / "unet"), variant="fp16"), 3, 32, 64, 0)
    with pytest.raises(UserInputError, match=r"model.unet.path .*subfolder 'nope'.*no such folder"):
        build_unet(UNetConfig(path=str(root), subfolder="nope"), 3, 32, 64, 0)


def test_a_pretrained_unet_must_fit_the_codec_and_text_width(saved):
    root, _, _ = saved
    with pytest.raises(UserInputError, match="model.unet.path.*4 .*3 input channels|3 input channels.*4"):
        build_unet(UNetConfig(path=str(root / "unet"), variant="v1"), 4, 32, 64, 0)
    with pytest.raises(UserInputError, match="cross-attends to width 64.*gives 32"):
        build_unet(UNetConfig(path=str(root / "unet"), variant="v1"), 3, 32, 32, 0)


def test_hub_id_offline_reads_only_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    config = TransformerConfig(kind="pixart", path="nobody/no-such-model", revision="main", subfolder="transformer")
    with pytest.raises(UserInputError, match="model.transformer.path 'nobody/no-such-model'.*HF_HUB_OFFLINE"):
        build_transformer(config, 3, 32, 64, 0)


def test_missing_local_paths_are_one_line_naming_the_key(tmp_path):
    model = ModelConfig(denoiser="transformer", transformer=TransformerConfig(path=str(tmp_path / "gone")))
    with pytest.raises(UserInputError, match=r"model.transformer.path '.*gone' should hold") as err:
        check_local_paths(model, "shapes", None)
    assert "\n" not in str(err.value)
    check_local_paths(ModelConfig(unet=UNetConfig(path="org/a-hub-model")), "shapes", None)  # a hub id: no check


def test_revision_without_path_is_a_recipe_error():
    with pytest.raises(RecipeError, match="model.unet.path"):
        tiny_recipe("model.unet.revision=main")


@pytest.mark.parametrize("part", ["unet", "transformer"])
def test_both_arms_of_a_pair_start_from_the_saved_weights(saved, part, tmp_path):
    root, unet, sd3 = saved
    source = unet.unet if part == "unet" else sd3.unet.transformer
    extra = [] if part == "unet" else ["model.denoiser=transformer", "model.transformer.kind=sd3"]
    variant = ["model.unet.variant=v1"] if part == "unet" else []
    train_pair(
        pair_recipe(
            "control",
            "train.max_steps=1",
            "tracking.every=1",
            *extra,
            *variant,
            f"model.{part}.path={root}",
            f"model.{part}.subfolder={part}",
        ),
        tmp_path,
    )
    prefix = "unet." if part == "unet" else "unet.transformer."
    expected = {prefix + k: v for k, v in source.state_dict().items()}
    for arm in "ab":
        step0 = load_file(str(tmp_path / arm / "checkpoints" / "step_000000.safetensors"))
        got = {k: v for k, v in step0.items() if k.startswith(prefix)}
        assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)
