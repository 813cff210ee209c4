"""A user's own LightningModule (``user_module.Denoiser``) tracked two ways, and a control pair.

- two separate Trainers with ``ArmCheckpoints`` plus ``divergence watch`` (the comparator),
- one Trainer fitting ``LockstepPair``:

the two stores hold the same steps and the same records, exactly (bitwise): on one CPU
process each arm computes the same floats whether alone or in lockstep, because the RNG
fork gives arm b the draws arm a saw, the global RNG after both arms equals the RNG after
one arm (both drew the same amount), and the comparator measures the same fp32 weights
read back from safetensors files as the tracker measures in memory.
"""

import csv
import json

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from divergence.comparator.follow import Comparator
from divergence.errors import UserInputError
from divergence.lightning import ArmCheckpoints, LockstepPair
from divergence.report.build import build_report
from divergence.store import MetricsStore
from tests.byo.user_module import build, loader, trainer

STEPS, EVERY = 7, 3
ARMS = {"a": "none", "b": "tanh"}  # exact vs tanh-approximated GELU


def lines(path):
    return [json.loads(line) for line in open(path)]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    for arm, approximate in ARMS.items():
        pl.seed_everything(0, verbose=False)
        module = build(0, approximate=approximate)
        trainer(STEPS, [ArmCheckpoints(root / "separate", arm, every=EVERY, name="gelu", dense=[])]).fit(module, loader())
    assert Comparator(root / "separate", log=False, progress=False).run(poll=0.05, timeout=10) == 0
    pl.seed_everything(0, verbose=False)
    pair = LockstepPair(build(0, approximate="none"), build(0, approximate="tanh"), out=root / "lockstep",
                        every=EVERY, name="gelu", dense=[])
    trainer(STEPS).fit(pair, loader())
    return root / "separate", root / "lockstep"


def test_separate_arms_and_lockstep_give_the_same_store(stores):
    separate, lockstep = stores
    assert MetricsStore(separate).steps() == MetricsStore(lockstep).steps() == list(range(STEPS + 1))
    a, b = lines(separate / "metrics.jsonl"), lines(lockstep / "metrics.jsonl")
    assert a == b  # every record, every float: bitwise (NaN losses at step 0 compare as equal objects)
    tracked = [r["step"] for r in a if r["type"] == "step" and r["tracked"]]
    assert tracked == [0, 3, 6, 7]
    last = a[-1]
    assert last["wasserstein"] > 0 and last["loss_a"] != last["loss_b"]  # the arms do differ
    info = json.loads((lockstep / "pair.json").read_text())
    assert info["finished"] and info["last_step"] == STEPS and info["contract"] == 1


def test_arm_files_follow_the_contract(stores):
    separate, _ = stores
    status = json.loads((separate / "a" / "status.json").read_text())
    assert status["state"] == "finished" and status["last_step"] == STEPS and status["attempt"] == 1
    names = sorted(p.name for p in (separate / "a" / "checkpoints").iterdir())
    assert names == [f"step_{s:06d}.safetensors" for s in (0, 3, 6, 7)]
    assert [r["step"] for r in lines(separate / "a" / "losses.jsonl")] == list(range(1, STEPS + 1))


def test_a_report_is_built(stores, tmp_path):
    report = build_report([stores[1]], tmp_path / "report", n_boot=50, min_steps=2)
    assert (tmp_path / "report" / "report.html").is_file()
    assert [p.name for p in report.analysis.pairs] == ["gelu"]


def test_rng_fork_makes_a_control_pair_exactly_zero(tmp_path):
    # the module draws noise, a noise level and dropout masks: without the fork, two calls differ
    module, (batch,) = build(0), next(iter(loader()))
    assert module.training_step([batch], 0)["loss"] != module.training_step([batch], 0)["loss"]
    pl.seed_everything(0, verbose=False)
    pair = LockstepPair(build(0), build(0), out=tmp_path, every=2, category="control")
    trainer(4).fit(pair, loader())
    steps = MetricsStore(tmp_path).step_records()
    assert [r["step"] for r in steps] == [0, 1, 2, 3, 4]
    for record in steps[1:]:
        assert record["loss_a"] == record["loss_b"]
    for record in MetricsStore(tmp_path).tensor_records():
        assert record["max_abs_diff"] == 0.0 and record["wasserstein"] == 0.0
    assert torch.equal(pair.module_a.net[0].weight, pair.module_b.net[0].weight)
    assert pair.module_a.net[0].weight.grad is not None  # it did train


def test_arm_logs_are_namespaced_and_bad_input_is_named(tmp_path):
    with pytest.raises(UserInputError, match="module_a and module_b are the same object"):
        module = build(0)
        LockstepPair(module, module, out=tmp_path)
    with pytest.raises(UserInputError, match="module='unet'.*no submodule"):
        LockstepPair(build(0), build(0), out=tmp_path, module="unet")
    pair = LockstepPair(build(0), build(0, approximate="tanh"), out=tmp_path, every=1)
    fit = trainer(2, logger=CSVLogger(tmp_path, name="csv", version=0))
    fit.fit(pair, loader())
    assert {"a/loss", "b/loss"} <= set(fit.callback_metrics)  # each arm's own self.log, by arm
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    keys = set(rows[0])
    assert {"divergence/model/wasserstein", "divergence/kind/linear/max_abs_diff", "train/loss_a", "train/loss_b"} <= keys
    logged = [float(r["divergence/model/max_abs_diff"]) for r in rows if r["divergence/model/max_abs_diff"]]
    assert logged == [r["max_abs_diff"] for r in MetricsStore(tmp_path).step_records()]


def test_lockstep_pair_resumes_from_a_checkpoint(tmp_path):
    """Resumed from its step-2 checkpoint, the pair drops the stored steps after 2 and continues to the end."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def fit(max_steps, ckpt_path=None):
        pl.seed_everything(0, verbose=False)
        pair = LockstepPair(build(0), build(0, approximate="tanh"), out=tmp_path / "pair", every=2)
        saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
        run = pl.Trainer(max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[saver])
        run.fit(pair, loader(), ckpt_path=ckpt_path)
        return run

    fit(4)  # "crashes" after step 4
    first = lines(tmp_path / "pair" / "metrics.jsonl")
    resumed = fit(6, ckpt_path=tmp_path / "ckpt" / "epoch=0-step=2.ckpt")
    assert resumed.global_step == 6
    store = MetricsStore(tmp_path / "pair")
    assert store.steps() == list(range(7))  # each step once: 3 and 4 were cut and computed again
    kept = [r for r in lines(tmp_path / "pair" / "metrics.jsonl") if r["step"] <= 2]
    assert kept == [r for r in first if r["step"] <= 2]
    assert json.loads((tmp_path / "pair" / "pair.json").read_text())["finished"]
