"""A fine-tuning study's start: the pretrained parts written as save_pretrained folders, loaded by every pair."""

import pytest
import torch
import yaml
from safetensors.torch import save_file

from divergence.config.schema import to_dict
from divergence.errors import RecipeError
from divergence.study.config import fine_tuned, load_study
from divergence.study.pretrain import check_pretrain, export_parts, folder, steps_logged
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs
from divergence.training.pair_setup import pretrained_start
from divergence.variants.pair_recipe import load_pair_recipe
from divergence.study.config import SHIPPED_RECIPES as RECIPES
from tests.training.tiny import tiny_recipe


def test_the_exported_parts_load_bitwise_as_a_pairs_start(tmp_path):
    recipe = tiny_recipe("model.seed=3")
    arm = Arm(recipe, Inputs(recipe).tokenizer)
    with torch.no_grad():  # weights no fresh init has: what "pretrained" means here
        for p in arm.parameters():
            p.add_(0.01)
    weights = {k: v.contiguous() for k, v in arm.weights().items()}
    save_file(weights, str(tmp_path / "step.safetensors"))
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(to_dict(recipe)))
    export_parts(tmp_path / "recipe.yaml", tmp_path / "step.safetensors", tmp_path / "pretrained")
    start = tiny_recipe(
        f"model.unet.path={tmp_path / 'pretrained' / 'unet'}",
        f"model.text_encoder.path={tmp_path / 'pretrained' / 'text_encoder'}",
    )
    loaded = Arm(start, Inputs(start).tokenizer).weights()
    assert loaded.keys() == weights.keys()
    assert all(torch.equal(loaded[k], weights[k]) for k in weights)
    assert pretrained_start(start).startswith("model.unet.path=")


def test_the_finetune_study_starts_every_pair_from_the_pretrained_folder(tmp_path):
    study = fine_tuned(load_study(RECIPES / "study-finetune.yaml"), tmp_path)
    assert study.pretrain["steps"] >= 100
    roles = {p.role: p.name for p in study.pairs}
    assert roles["seed"] == "data-seed" and "reordering" not in roles
    where = str(folder(tmp_path).resolve() / "unet")
    for pair in study.pairs:
        assert pair.recipe["recipe"]["model"]["unet"]["path"] == where
        assert pair.recipe["recipe"]["train"]["lr"] == 1e-4
    scratch = tmp_path / "seed.yaml"
    scratch.write_text(yaml.safe_dump({**study.pairs[1].recipe, "replicate": 1}))
    pair = load_pair_recipe(scratch)
    assert pair.category == "seed" and pair.arm_recipes["a"].model.unet.path == where


@pytest.mark.parametrize("spec", [{"steps": 0}, {"recipe": {}}, {"steps": 5, "epochs": 1}, 7])
def test_a_bad_pretrain_names_the_key(spec):
    with pytest.raises(RecipeError, match="study.yaml: pretrain"):
        check_pretrain(spec, "study.yaml")


def test_the_pretraining_bar_reads_the_steps_from_the_runs_csv_log(tmp_path):
    """The bar's count: the last whole row's step + 1 of Lightning's CSV log, 0 before it has a row,
    whatever the column order."""
    assert steps_logged(tmp_path) == 0  # no log yet
    log = tmp_path / "csv" / "metrics.csv"
    log.parent.mkdir()
    log.write_text("epoch,step,train/loss\n")
    assert steps_logged(tmp_path) == 0
    log.write_text("epoch,step,train/loss\n0,0,1.1\n0,1,0.9\n0,2,0.8\n")
    assert steps_logged(tmp_path) == 3
    log.write_text("train/loss,step\n1.1,0\n0.9,1\n0.8,")
    assert steps_logged(tmp_path) == 2  # a half-written row is not read: the last whole one counts


def _fine_tune_study(tmp_path, steps: int):
    """A fine-tune study of the tiny UNet pretrained ``steps`` steps at 16x16, batch 2 (seconds), the
    control its one pair."""
    path = tmp_path / "finetune.yaml"
    path.write_text(
        f"base: {RECIPES / 'tiny.yaml'}\nstudy: {RECIPES / 'pairs' / 'control.yaml'}\n"
        f"pretrain: {{steps: {steps}, recipe: {{data: {{resolution: 16}}, train: {{batch_size: 2}}}}}}\n"
    )
    return path


def _unet(out):
    from safetensors.torch import load_file

    return load_file(str(folder(out) / "unet" / "diffusion_pytorch_model.safetensors"))


def test_a_pretrained_model_of_another_recipe_is_built_again_or_refused_never_reused(tmp_path, capsys):
    """OUT/pretrained is keyed on its pretraining recipe: built from 2 steps, a study asking 1 step pretrains
    again saying why (it reused the 2-step model silently, reading only config.json); asking the same
    recipe again trains nothing; a study whose pair runs already fine-tuned the model refuses in one line."""
    from divergence.cli import main
    from divergence.study.pretrain import ensure_pretrained

    out = tmp_path / "out"
    two = load_study(_fine_tune_study(tmp_path, 2))
    ensure_pretrained(two.base, two.pretrain, out, quiet=True)
    built = _unet(out)
    capsys.readouterr()
    one = load_study(_fine_tune_study(tmp_path, 1))
    ensure_pretrained(one.base, one.pretrain, out, quiet=True)
    assert "(train.max_steps 2, this study's 1): pretraining again" in capsys.readouterr().out
    rebuilt = _unet(out)
    assert any(not torch.equal(rebuilt[k], v) for k, v in built.items())  # one step from the init, not two
    log = (folder(out) / "pretrain.log").stat().st_size
    ensure_pretrained(one.base, one.pretrain, out, quiet=True)  # the same recipe: the cache
    assert capsys.readouterr().out == "" and (folder(out) / "pretrain.log").stat().st_size == log
    started = out / "control" / "r0"  # a pair run fine-tuned from the 1-step model
    started.mkdir(parents=True)
    (started / "pair.yaml").write_text("name: control\n")
    code = main(
        ["study", "--recipe", str(_fine_tune_study(tmp_path, 1)), "--out", str(out), "--quiet", "pretrain.steps=2"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "train.max_steps 1, this study's 2" in err, err
    assert "give a new --out" in err and all(torch.equal(_unet(out)[k], v) for k, v in rebuilt.items())
