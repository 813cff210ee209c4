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
from divergence.training.probe_files import FileProbe
from divergence.errors import UserInputError
from divergence.lightning import ArmCheckpoints, LockstepPair
from divergence.report.build import build_report
from divergence.store import MetricsStore
from tests.byo.user_module import Denoiser, build, loader, trainer

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
        trainer(STEPS, [ArmCheckpoints(root / "separate", arm, every=EVERY, name="gelu", dense=[])]).fit(
            module, loader()
        )
    assert Comparator(root / "separate", log=False, progress=False, probe=FileProbe).run(poll=0.05, timeout=10) == 0
    pl.seed_everything(0, verbose=False)
    pair = LockstepPair(
        build(0, approximate="none"),
        build(0, approximate="tanh"),
        out=root / "lockstep",
        every=EVERY,
        name="gelu",
        dense=[],
    )
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
    assert {
        "divergence/model/wasserstein",
        "divergence/kind/linear/max_abs_diff",
        "train/loss_a",
        "train/loss_b",
    } <= keys
    logged = [float(r["divergence/model/max_abs_diff"]) for r in rows if r["divergence/model/max_abs_diff"]]
    assert logged == [r["max_abs_diff"] for r in MetricsStore(tmp_path).step_records()]


def test_lockstep_pair_resumes_from_a_checkpoint(tmp_path):
    """Resumed from its step-2 checkpoint, the pair drops the stored steps after 2 and continues to the end."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def fit(max_steps, ckpt_path=None):
        pl.seed_everything(0, verbose=False)
        pair = LockstepPair(build(0), build(0, approximate="tanh"), out=tmp_path / "pair", every=2)
        saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
        run = pl.Trainer(
            max_steps=max_steps,
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[saver],
        )
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


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_lockstep_pair_refuses_another_pair_and_a_rerun(tmp_path):
    """The issue's case: a second pair into the same folder cut steps 1-3 without a word, left the
    first pair's step 0 under the new one and made pair.json say a finished control."""
    first = dict(out=tmp_path, every=1, name="first", dense=[])
    trainer(3).fit(LockstepPair(build(0), build(1, approximate="tanh"), **first), loader())
    step0 = MetricsStore(tmp_path).step_records()[0]["max_abs_diff"]
    assert step0 > 0  # two seeds: the arms start apart
    before = _files(tmp_path)
    second = LockstepPair(build(2), build(2), out=tmp_path, every=1, name="second", category="control")
    with pytest.raises(UserInputError, match="holds pair 'first' with name 'first', not 'second'") as err:
        trainer(3).fit(second, loader())
    assert "\n" not in str(err.value)
    with pytest.raises(UserInputError, match=r"already holds pair 'first' with steps 0 to 3 stored.*resume=True"):
        trainer(3).fit(LockstepPair(build(0), build(1, approximate="tanh"), **first), loader())
    assert _files(tmp_path) == before  # nothing cut, nothing rewritten
    # told to: the pair is trained again from step 0, every stored step replaced (none mixed in)
    trainer(3).fit(LockstepPair(build(2), build(2), resume=True, **first), loader())
    records = MetricsStore(tmp_path).step_records()
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all(r["max_abs_diff"] == 0.0 for r in records)  # the new arms, from step 0 on
    info = json.loads((tmp_path / "pair.json").read_text())
    assert info["name"] == "first" and info["category"] == "optimization" and info["finished"]


class TwoOptimizers(pl.LightningModule):
    """Manual optimization with two optimizers, each stepped once per batch: Lightning's
    global_step moves by 2 per batch."""

    def __init__(self, lr: float):
        super().__init__()
        self.automatic_optimization = False
        self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        (x,) = batch
        loss = (self.second(torch.tanh(self.first(x))) - x).pow(2).mean()
        optimizers = self.optimizers()
        for opt in optimizers:
            opt.zero_grad()
        self.manual_backward(loss)
        for opt in optimizers:
            opt.step()
        return loss

    def configure_optimizers(self):
        return [
            torch.optim.SGD(self.first.parameters(), lr=self.lr),
            torch.optim.SGD(self.second.parameters(), lr=self.lr),
        ]


def test_arm_checkpoints_on_two_optimizers_records_every_second_step(tmp_path):
    """The issue's case: losses landed at 2, 4, 6 and watch waited for step 1 forever. The arm now
    records Lightning's global_step with stride 2 in pair.json, and watch follows those steps."""
    for arm, lr in (("a", 0.05), ("b", 0.07)):
        torch.manual_seed(0)
        trainer(6, [ArmCheckpoints(tmp_path, arm, every=3, name="two-opt", dense=[])]).fit(TwoOptimizers(lr), loader())
    assert json.loads((tmp_path / "pair.json").read_text())["tracking"]["stride"] == 2
    assert [r["step"] for r in lines(tmp_path / "a" / "losses.jsonl")] == [2, 4, 6]
    assert Comparator(tmp_path, log=False, progress=False, probe=FileProbe).run(poll=0.05, timeout=5) == 0
    records = MetricsStore(tmp_path).step_records()
    assert [r["step"] for r in records] == [0, 2, 4, 6]
    assert [r["step"] for r in records if r["tracked"]] == [0, 4, 6]  # scheduled 3 is compared at 4
    assert records[-1]["loss_a"] == lines(tmp_path / "a" / "losses.jsonl")[-1]["loss"]
    assert records[-1]["max_abs_diff"] > 0
    with pytest.raises(UserInputError, match="max_steps=5 is not a multiple of stride=2.*use max_steps=6"):
        trainer(5, [ArmCheckpoints(tmp_path / "odd", "a")]).fit(TwoOptimizers(0.1), loader())


def test_epochs_that_end_before_max_steps_end_the_pair(tmp_path):
    """The issue's case: Trainer(max_steps=10, max_epochs=1) stopped at the epoch's end, both arms
    said "failed at 4" and watch waited for step 5. The pair's length is where the Trainer stops."""
    batches = len(loader())
    for arm, approximate in ARMS.items():
        pl.seed_everything(0, verbose=False)
        trainer(batches + 5, [ArmCheckpoints(tmp_path, arm, every=3, dense=[])], max_epochs=1).fit(
            build(0, approximate=approximate), loader()
        )
    assert json.loads((tmp_path / "pair.json").read_text())["max_steps"] == batches
    assert json.loads((tmp_path / "a" / "status.json").read_text())["state"] == "finished"
    assert Comparator(tmp_path, log=False, progress=False, probe=FileProbe).run(poll=0.05, timeout=5) == 0
    assert MetricsStore(tmp_path).steps() == list(range(batches + 1))


def test_an_early_stop_finishes_the_arms_at_the_step_reached(tmp_path):
    """EarlyStopping stopped both arms at the end of their first epoch (step
    8 of max_steps 100); both ended ``failed`` and watch stopped at step 9. An early stop is a
    finish at the step reached: the arms are ``finished`` at 8, compared there, and the pair ends there."""
    from lightning.pytorch.callbacks import EarlyStopping

    batches = len(loader())
    for arm, approximate in ARMS.items():
        pl.seed_everything(0, verbose=False)
        stop = EarlyStopping(monitor="loss", stopping_threshold=1e9, check_on_train_epoch_end=True)
        trainer(100, [ArmCheckpoints(tmp_path, arm, every=3, dense=[]), stop]).fit(
            build(0, approximate=approximate), loader()
        )
    status = json.loads((tmp_path / "a" / "status.json").read_text())
    assert (status["state"], status["last_step"]) == ("finished", batches)
    assert (tmp_path / "b" / "checkpoints" / f"step_{batches:06d}.safetensors").is_file()
    assert Comparator(tmp_path, log=False, progress=False, probe=FileProbe).run(poll=0.05, timeout=5) == 0
    records = MetricsStore(tmp_path).step_records()
    assert [r["step"] for r in records] == list(range(batches + 1))
    assert records[-1]["tracked"] and records[-1]["max_abs_diff"] > 0
    info = json.loads((tmp_path / "pair.json").read_text())
    assert (info["finished"], info["last_step"]) == (True, batches)


class Stream(torch.utils.data.IterableDataset):
    """A stream of unknown length (no ``__len__``): the Trainer cannot say where it ends."""

    def __iter__(self):
        yield from loader()


def test_a_trainer_of_unknown_length_trains_an_open_ended_arm(tmp_path):
    """No max_steps and an iterable dataset: the arms end where fit ends, and watch ends there too."""
    batches = len(loader())
    for arm, approximate in ARMS.items():
        pl.seed_everything(0, verbose=False)
        trainer(-1, [ArmCheckpoints(tmp_path, arm, every=3, dense=[])], max_epochs=1).fit(
            build(0, approximate=approximate), torch.utils.data.DataLoader(Stream(), batch_size=None)
        )
    assert json.loads((tmp_path / "pair.json").read_text())["max_steps"] is None
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir())[-1] == f"step_{batches:06d}.safetensors"
    assert Comparator(tmp_path, log=False, progress=False, probe=FileProbe).run(poll=0.05, timeout=5) == 0
    assert MetricsStore(tmp_path).steps() == list(range(batches + 1))
    assert json.loads((tmp_path / "pair.json").read_text())["max_steps"] == batches


def test_a_training_step_without_a_loss_is_named(tmp_path):
    class NoLoss(pl.LightningModule):
        def __init__(self, returns):
            super().__init__()
            self.layer, self.returns = torch.nn.Linear(8, 8), returns

        def training_step(self, batch, batch_idx):
            return self.returns

        def configure_optimizers(self):
            return torch.optim.SGD(self.layer.parameters(), lr=0.1)

    with pytest.raises(
        UserInputError, match=r"training_step returned nothing \(None, which Lightning passes on as"
    ) as err:
        trainer(2, [ArmCheckpoints(tmp_path, "a")]).fit(NoLoss(None), loader())
    assert "returned dict" not in str(err.value)  # the words for a None


def test_a_control_pair_with_an_empty_tensor_is_exactly_zero(tmp_path):
    """The issue's case: a 0-element tensor was counted as NaN/inf, and a bitwise-identical control
    pair was reported "not exactly zero"."""
    from divergence.analysis.layers import noise_floor
    from divergence.report.inputs import load_pair

    arms = []
    for _ in "ab":
        module = build(0)
        module.register_buffer("empty", torch.zeros(0, 4))
        arms.append(module)
    pl.seed_everything(0, verbose=False)
    trainer(2).fit(LockstepPair(*arms, out=tmp_path, every=1, category="control", dense=[]), loader())
    empty = [r for r in MetricsStore(tmp_path).tensor_records() if r["tensor"] == "empty"]
    assert len(empty) == 3 and all(r["max_abs_diff"] == 0.0 and r["nonfinite_a"] == 0 for r in empty)
    assert all(r["tensors_nonfinite"] == 0 for r in MetricsStore(tmp_path).step_records())
    assert noise_floor(load_pair(tmp_path)).exact


def test_a_vector_loss_is_named_not_averaged(tmp_path):
    """The issue's case: a vector loss was a raw ValueError in ArmWriter; through ArmCheckpoints'
    ``loss=`` it was averaged silently. Both are one line naming what was given."""

    class PerSample(Denoiser):
        def training_step(self, batch, batch_idx):
            (x,) = batch
            per_sample = (self(x) - x).pow(2).mean(1)  # (B,)
            return {"loss": per_sample.mean(), "per_sample": per_sample}

    callback = ArmCheckpoints(tmp_path, "a", loss=lambda out: out["per_sample"])
    with pytest.raises(UserInputError, match=r"the loss of a batch: loss is a Tensor of shape \(8,\)"):
        trainer(2, [callback]).fit(PerSample(), loader())
    assert json.loads((tmp_path / "a" / "status.json").read_text())["state"] == "failed"


def test_a_checkpoint_holds_the_spike_detectors_after_its_step(tmp_path):
    """A checkpoint Lightning writes at step 4 holds spike detectors that saw step 4's losses: the tracker
    records the step before the checkpoint callback runs, so a run resumed there flags what an
    uninterrupted one flags (recorded after the callbacks, the state missed the checkpoint's own step)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    pl.seed_everything(0, verbose=False)
    pair = LockstepPair(build(0), build(0, approximate="tanh"), out=tmp_path / "pair", every=2)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    run = pl.Trainer(
        max_steps=4,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[saver],
    )
    run.fit(pair, loader())
    ckpt = torch.load(tmp_path / "ckpt" / "epoch=0-step=4.ckpt", weights_only=False)  # this test's own file
    state = ckpt["callbacks"]["DivergenceTracker"]
    records = [r for r in MetricsStore(tmp_path / "pair").step_records() if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert state["a"]["history"] == [r["loss_a"] for r in records]
    assert state["b"]["history"] == [r["loss_b"] for r in records]
