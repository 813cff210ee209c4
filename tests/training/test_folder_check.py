"""The one "may this folder be trained by this command" check, on written folders (no training)."""

import pytest
import yaml

from divergence.errors import UserInputError
from divergence.config.schema import to_dict
from divergence.training.folder_check import LOCKSTEP, RUN, SEPARATE, check_folder, first_change
from divergence.training.pair_setup import pair_config
from tests.pairs.helpers import pair_recipe
from tests.training.tiny import tiny_recipe


def _without(config: dict, *dotted: str) -> dict:
    """``config`` with the keys ``dotted`` left out (a recipe another divergence version saved)."""
    out = yaml.safe_load(yaml.safe_dump(config))
    for key in dotted:
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node[part]
        del node[last]
    return out


def _run_folder(tmp_path, saved: dict):
    (tmp_path / "checkpoints").mkdir(parents=True)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(saved))
    return tmp_path


def test_a_saved_recipe_without_a_key_is_refused_in_one_line(tmp_path):
    """No key is read as its default: a folder whose recipe lacks one is trained again, not resumed."""
    now = to_dict(tiny_recipe("train.precision=bf16-mixed"))
    out = _run_folder(tmp_path / "run", _without(now, "train.cpu_autocast"))
    with pytest.raises(UserInputError, match=r"recipe.yaml \(a run\) has train.cpu_autocast = None, this command "):
        check_folder(out, RUN, now)
    pair = pair_recipe("seed-vs-seed")
    for kind in (LOCKSTEP, SEPARATE):
        assert first_change(_without(pair_config(pair), "replicate"), pair_config(pair), kind)[0] == "replicate"


def test_what_may_change_depends_on_the_kind():
    pair = pair_config(pair_recipe("seed-vs-seed"))
    more_steps = pair_config(pair_recipe("seed-vs-seed", "train.max_steps=999"))
    assert first_change(pair, more_steps, LOCKSTEP) == (None, None, None)  # extending a lockstep pair
    assert first_change(pair, more_steps, SEPARATE)[0] == "recipes.a.train.max_steps"
    devices = pair_config(pair_recipe("seed-vs-seed", "train.devices=2"))
    assert first_change(pair, devices, SEPARATE) == (None, None, None)  # how one job runs
    assert first_change(pair, devices, LOCKSTEP)[0] == "recipes.a.train.devices"


def test_a_run_folder_with_another_recipe_is_refused_in_one_line(tmp_path):
    out = _run_folder(tmp_path / "run", to_dict(tiny_recipe()))
    check_folder(out, RUN, to_dict(tiny_recipe("train.max_steps=99")))  # extending: fine
    with pytest.raises(UserInputError, match=r"recipe.yaml \(a run\) has train.lr = 0.001, this command 0.5"):
        check_folder(out, RUN, to_dict(tiny_recipe("train.lr=0.5")))
    with pytest.raises(UserInputError, match="holds a single run, not a pair"):
        check_folder(out, LOCKSTEP, pair_config(pair_recipe("seed-vs-seed")))
    with pytest.raises(UserInputError, match="holds a single run, not a pair"):
        check_folder(out, SEPARATE, pair_config(pair_recipe("seed-vs-seed")), arm="a")


def _pair_folder(tmp_path, pair):
    from divergence.training.pair_setup import write_pair_files

    (tmp_path / "resume").mkdir(parents=True)
    write_pair_files(tmp_path, pair, keep=False)
    return tmp_path


def test_a_resume_in_another_thread_count_is_refused_the_cadence_may_change(tmp_path):
    """A CPU splits its reductions by thread: the same replicate with 1 and 2 threads differs from step 1."""
    out = _pair_folder(tmp_path / "pair", pair_recipe("seed-vs-seed"))
    check_folder(out, LOCKSTEP, pair_config(pair_recipe("seed-vs-seed", "train.max_steps=99", "data.workers=2")))
    with pytest.raises(UserInputError, match=r"has recipes.a.train.cpu_threads = 1, this command 2"):
        check_folder(out, LOCKSTEP, pair_config(pair_recipe("seed-vs-seed", "train.cpu_threads=2")))
    with pytest.raises(UserInputError, match=r"has train.cpu_threads = 1, this command 0"):
        check_folder(
            _run_folder(tmp_path / "run", to_dict(tiny_recipe())), RUN, to_dict(tiny_recipe("train.cpu_threads=0"))
        )


def test_a_resume_in_other_numerics_than_pair_json_recorded_is_refused(tmp_path):
    from divergence.training.folder_check import check_numerics
    from divergence.training.pair_setup import pair_numerics

    pair = pair_recipe("seed-vs-seed")
    out = _pair_folder(tmp_path / "pair", pair)
    check_numerics(out, pair_numerics(pair))  # the same numerics: fine
    elsewhere = {arm: dict(n, device="cuda") for arm, n in pair_numerics(pair).items()}
    with pytest.raises(UserInputError, match=r"pair.json says arm a trained with device = 'cpu', this command 'cuda'"):
        check_numerics(out, elsewhere)
    (out / "pair.json").write_text((out / "pair.json").read_text().replace('"numerics"', '"numerics_old"'))
    with pytest.raises(UserInputError, match=r"pair.json says arm a trained with \w+ = None, this command "):
        check_numerics(out, pair_numerics(pair))  # no numerics recorded: nothing says it may resume
