"""The one "may this folder be trained by this command" check, on written folders (no training)."""

import pytest
import yaml

from divergence.errors import UserInputError
from divergence.config.schema import to_dict
from divergence.training.folder_check import LOCKSTEP, RUN, SEPARATE, check_folder, first_change
from divergence.training.pair_setup import pair_config
from tests.pairs.helpers import pair_recipe
from tests.training.tiny import tiny_recipe


def _older(config: dict, *dotted: str) -> dict:
    """``config`` as a folder written before the keys ``dotted`` existed (they are left out)."""
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


def test_a_key_an_older_folder_lacks_is_no_change_at_its_default():
    now = to_dict(tiny_recipe())
    older = _older(now, "train.deterministic", "train.tf32", "train.grad_noise", "log.project")
    assert first_change(older, now, RUN) == (None, None, None)
    changed = to_dict(tiny_recipe("train.tf32=true"))
    assert first_change(older, changed, RUN) == ("train.tf32", None, True)  # not the default: a change


def test_a_16_bit_cpu_folder_older_than_cpu_autocast_computed_natively():
    """Folders written before train.cpu_autocast computed bf16/fp16 on a CPU with PyTorch's kernels:
    resuming them with today's default (emulate) would change what is computed mid-run."""
    bf16 = to_dict(tiny_recipe("train.precision=bf16-mixed"))
    assert first_change(_older(bf16, "train.cpu_autocast"), bf16, RUN) == ("train.cpu_autocast", None, "emulate")
    native = to_dict(tiny_recipe("train.precision=bf16-mixed", "train.cpu_autocast=native"))
    assert first_change(_older(bf16, "train.cpu_autocast"), native, RUN) == (None, None, None)
    fp32 = to_dict(tiny_recipe())  # no autocast: the key changes nothing
    assert first_change(_older(fp32, "train.cpu_autocast"), fp32, RUN) == (None, None, None)
    gpu = to_dict(tiny_recipe("train.precision=bf16-mixed", "train.accelerator=gpu"))
    assert first_change(_older(gpu, "train.cpu_autocast"), gpu, RUN) == (None, None, None)


def test_pair_keys_added_later_are_read_as_defaults_in_every_kind():
    pair = pair_recipe("seed-vs-seed")
    now = pair_config(pair)
    older = _older(now, "replicate", "tracking.dense", "recipes.a.train.tf32", "recipes.b.train.tf32")
    for kind in (LOCKSTEP, SEPARATE):
        assert first_change(older, now, kind) == (None, None, None)
    probe_off = _older(now, "tracking.probe")  # tests shrink the probe: size 4 is not the default
    assert first_change(probe_off, now, SEPARATE)[0] == "tracking.probe.size"
    replicate = pair_config(pair_recipe("seed-vs-seed", "replicate=2"))
    assert first_change(older, replicate, SEPARATE)[0] == "recipes.a.data.seed"


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
    check_numerics(out, elsewhere)  # a folder written before pair.json had numerics: nothing to compare
