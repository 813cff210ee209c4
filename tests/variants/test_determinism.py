"""Determinism and TF32: the recipe switches, the tf32 variant and pair, and the flags in a real run."""

import os

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from divergence.errors import RecipeError, UserInputError
from divergence.config.schema import to_dict
from divergence.models.determinism import CUBLAS_VAR, arm_numerics, determinism, numerics_state
from divergence.training.lockstep import train_pair
from divergence.training.folder_check import flatten_keys
from divergence.variants import parse_variant
from tests.pairs.helpers import DIT, pair_recipe, step_records


def _arm_keys(pair, arm) -> dict:
    return {k: v for k, v in flatten_keys(to_dict(pair.arm_recipes[arm])).items() if k != "name"}


def test_tf32_pair_differs_from_control_only_in_train_tf32():
    tf32, control = pair_recipe("tf32-vs-fp32"), pair_recipe("control")
    a, b, c = _arm_keys(tf32, "a"), _arm_keys(tf32, "b"), _arm_keys(control, "a")
    assert {k for k in a if a[k] != c[k]} == {"train.tf32"} and a["train.tf32"] is True
    assert b == c  # arm b is the control arm: fp32, deterministic
    assert c["train.deterministic"] is True and c["train.tf32"] is False  # the defaults a pair trains with
    assert tf32.category == "optimization" and tf32.labels() == {"a": ["tf32"], "b": ["tf32=False"]}


def test_tf32_variant_refuses_a_non_bool():
    with pytest.raises(RecipeError, match=r"arms.a\[0\]: expected true or false"):
        parse_variant({"tf32": "on"}, "arms.a[0]")


class RecordNumerics(Callback):
    """The process's flags after each step, and each arm's TF32 flags while its UNet runs."""

    def __init__(self):
        self.between_steps, self.in_arm = [], {"a": set(), "b": set()}

    def on_train_start(self, trainer, pl_module):
        for name, arm in pl_module.arms.items():
            arm.unet.register_forward_pre_hook(
                lambda module, args, name=name: self.in_arm[name].add(
                    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
                )
            )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.between_steps.append(numerics_state())


def test_a_run_trains_deterministic_with_tf32_only_inside_its_arm(tmp_path):
    before = numerics_state()
    recorder = RecordNumerics()
    # on the DiT (a step ~3x cheaper): the flags are the process's and the arm's, whatever the denoiser;
    # the function-space probe runs both arms in the reference numerics (TF32 off) on purpose: left out here
    train_pair(
        pair_recipe("tf32-vs-fp32", *DIT, "train.max_steps=2", "tracking.every=1", "tracking.probe.enabled=false"),
        tmp_path,
        callbacks=[recorder],
    )
    assert recorder.in_arm == {"a": {(True, True)}, "b": {(False, False)}}
    assert len(recorder.between_steps) == 2
    for state in recorder.between_steps:
        assert state["deterministic_algorithms"] and state["cudnn_deterministic"]
        assert not state["cudnn_benchmark"] and not state["tf32_matmul"] and not state["tf32_cudnn"]
        assert state["cublas_workspace"] in (":4096:8", ":16:8")
    assert numerics_state() == {**before, "cublas_workspace": os.environ.get(CUBLAS_VAR)}  # restored after fit
    # on a CPU TF32 changes nothing: the tf32 pair is the control pair, exactly zero
    assert all(r["max_abs_diff"] == 0.0 for r in step_records(tmp_path).values())


def test_deterministic_false_leaves_torch_defaults(tmp_path):
    pair = pair_recipe("control", "train.deterministic=false")
    before = numerics_state()
    with determinism(pair.base.train):
        assert numerics_state()["deterministic_algorithms"] == before["deterministic_algorithms"]
        assert not numerics_state()["tf32_matmul"]  # TF32 stays off unless an arm turns it on
        with arm_numerics(pair.arm_recipes["a"].train):
            assert not torch.backends.cuda.matmul.allow_tf32


def test_a_kernel_without_a_deterministic_implementation_is_one_line_naming_it():
    train = pair_recipe("control").base.train
    torch.use_deterministic_algorithms(False)  # a Trainer(deterministic=True) earlier in this process leaves it on
    with pytest.raises(
        UserInputError,
        match=r"^put_ has no deterministic implementation .* "
        r"set train\.deterministic=false",
    ) as err:
        with determinism(train):
            torch.zeros(4).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))  # no deterministic CPU kernel
    assert "\n" not in str(err.value)
    assert not torch.are_deterministic_algorithms_enabled()  # restored on the way out


def test_a_nondeterministic_cublas_setting_is_refused(monkeypatch):
    monkeypatch.setenv(CUBLAS_VAR, ":0:0")
    with pytest.raises(UserInputError, match=f"{CUBLAS_VAR}=:0:0"):
        with determinism(pair_recipe("control").base.train):
            pass
