"""Run recipes: the shipped YAML parses, and every kind of bad input is one line naming the key."""

from pathlib import Path

import pytest

from divergence.cli import main
from divergence.errors import RecipeError
from divergence.recipe.run import RunRecipe, latent_shape, load_run_recipe
from divergence.config.schema import parse

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_tiny_yaml_is_the_builtin_default():
    assert load_run_recipe(RECIPES / "tiny.yaml") == RunRecipe()


def test_sd15_yaml_is_latent_space_bf16():
    recipe = load_run_recipe(RECIPES / "sd15.yaml")
    assert recipe.train.precision == "bf16-mixed"
    assert latent_shape(recipe) == (4, 64, 64)


def test_overrides_reach_nested_keys():
    recipe = load_run_recipe(RECIPES / "tiny.yaml", ["train.lr=0.0003", "model.unet.block_out_channels=[16,32,32]"])
    assert recipe.train.lr == 0.0003 and recipe.model.unet.block_out_channels == (16, 32, 32)


@pytest.mark.parametrize(
    "override, key",
    [
        ("model.unet.bogus=1", "model.unet.bogus"),
        ("train.lr=fast", "train.lr"),
        ("train.batch_size=0", "batch_size"),
        ("train.precision=fp8", "train.precision"),
        ("model.unet.norm_num_groups=7", "norm_num_groups"),
        ("model.unet.down_block_types=[DownBlock2D]", "down_block_types"),
        ("data.resolution=34", "data.resolution"),
        ("data.source=imagefolder", "path"),
    ],
)
def test_bad_recipe_is_one_line_exit_2(override, key, tmp_path, capsys):
    code = main(["train", "--recipe", str(RECIPES / "tiny.yaml"), "--out", str(tmp_path / "run"), override])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and key in err, err
    assert not (tmp_path / "run").exists()  # nothing started


def test_missing_recipe_file(tmp_path, capsys):
    assert main(["train", "--recipe", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "run")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_sd15_without_local_weights_says_what_to_put_where(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--recipe", str(RECIPES / "sd15.yaml"), "--out", "run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    for key, path in [
        ("model.tokenizer.path", "pretrained/sd15/tokenizer"),
        ("model.vae.path", "pretrained/sd15/vae"),
        ("model.text_encoder.path", "pretrained/sd15/text_encoder"),
        ("data.path", "data/train"),
    ]:
        assert f"{key} {path!r}" in err, err


def test_unknown_attention_variant_names_the_key(tmp_path, capsys):
    code = main(["train", "--out", str(tmp_path / "run"), "attention.name=warp", "log.wandb=false"])
    err = capsys.readouterr().err
    assert code == 2 and "attention.name" in err and "warp" in err


def test_unknown_key_error_lists_allowed_keys():
    with pytest.raises(RecipeError, match="allowed keys in train: .*batch_size"):
        parse(RunRecipe, {"train": {"batchsize": 4}})


def test_variant_the_device_cannot_run_fails_at_start(tmp_path, capsys):
    code = main(
        [
            "train",
            "--out",
            str(tmp_path / "run"),
            "attention.name=sdpa-efficient",
            "train.accelerator=cpu",
            "log.wandb=false",
            "log.progress_bar=false",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "attention.name 'sdpa-efficient'" in err and "cpu" in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()
