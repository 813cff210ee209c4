"""Two arms trained as separate jobs plus the comparator give the lockstep pair's store, bitwise."""

import json
import shutil

import pytest
from lightning.pytorch.callbacks import Callback

from divergence.cli import main
from divergence.comparator.follow import Comparator
from divergence.training.probe_files import FileProbe
from divergence.store import MetricsStore
from divergence.pairfolder.arm.status import ArmStatus
from divergence.training.separate_arm import train_arm

from .conftest import seed_pair

TRACKED = [0, 2, 3, 4]


def _watch(out, **kwargs) -> int:
    return Comparator(out, log=kwargs.pop("log", False), progress=False, probe=FileProbe).run(poll=0.01, **kwargs)


def test_arms_write_checkpoints_at_every_tracked_step_byte_identical_to_lockstep(trained):
    for arm in "ab":
        folder = trained / "arms" / arm / "checkpoints"
        assert sorted(p.name for p in folder.iterdir()) == [f"step_{s:06d}.safetensors" for s in TRACKED]
        for step in (0, 2, 4):  # the steps lockstep saves too
            name = f"step_{step:06d}.safetensors"
            assert (folder / name).read_bytes() == (trained / "lockstep" / arm / "checkpoints" / name).read_bytes()
        status = ArmStatus.read(trained / "arms" / arm)
        assert status.finished and status.last_step == 4 and status.attempt == 1 and status.world_size == 1
    losses = (trained / "arms/a/losses.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in losses] == [1, 2, 3, 4]


@pytest.fixture(scope="module")
def watched(trained, tmp_path_factory):
    """The separately trained arms followed once by ``divergence watch`` (read it; copy it to change it)."""
    out = tmp_path_factory.mktemp("watched") / "pair"
    shutil.copytree(trained / "arms", out)
    assert main(["watch", str(out), "--poll", "0.01", "--timeout", "30", "--quiet"]) == 0
    return out


def test_watch_writes_the_lockstep_store_bitwise(watched, trained):
    assert (watched / "metrics.jsonl").read_bytes() == (trained / "lockstep/metrics.jsonl").read_bytes()
    info = json.loads((watched / "pair.json").read_text())
    assert info["finished"] and info["last_step"] == 4 and info["category"] == "seed"
    assert (watched / "csv/metrics.csv").is_file()  # the pair's loggers, as in lockstep


class Stop(Exception):
    pass


def test_a_restarted_comparator_continues_without_duplicates_or_gaps(arms, trained, monkeypatch):
    appended = []
    original = MetricsStore.append_step

    def append_then_die(self, step, *args):
        original(self, step, *args)
        appended.append(step)
        if step == 2:
            raise Stop  # killed after committing step 2

    monkeypatch.setattr(MetricsStore, "append_step", append_then_die)
    with pytest.raises(Stop):
        _watch(arms)
    with open(arms / "metrics.jsonl", "a") as f:
        f.write('{"type":"tensor","step":3,"tensor":"unet.transformer.pos_em')  # torn write of the step in flight
    assert _watch(arms, timeout=30) == 0
    assert appended == [0, 1, 2, 3, 4]  # every step once
    assert (arms / "metrics.jsonl").read_bytes() == (trained / "lockstep/metrics.jsonl").read_bytes()


def test_a_partly_written_checkpoint_is_never_read(arms, trained):
    path = arms / "b/checkpoints/step_000003.safetensors"
    full = path.read_bytes()
    path.write_bytes(full[: len(full) // 2])  # truncated: e.g. a copy still in progress
    (path.parent / ".step_000003.safetensors.4242.tmp").write_bytes(full[:100])  # an arm mid-write
    assert _watch(arms, timeout=0.3) == 1  # waits at step 3, then times out
    assert MetricsStore(arms).last_step() == 2
    path.write_bytes(full)
    assert _watch(arms, timeout=30) == 0
    assert (arms / "metrics.jsonl").read_bytes() == (trained / "lockstep/metrics.jsonl").read_bytes()


def test_an_arm_restarted_from_an_earlier_step_is_followed(watched, trained, tmp_path, monkeypatch):
    arms = tmp_path / "pair"
    shutil.copytree(watched, arms)  # followed to its last step
    status = ArmStatus.read(arms / "b")
    status.attempt, status.start_step = 2, 2  # arm b was requeued and resumed from step 2
    status.write(arms / "b")
    steps = []
    original = MetricsStore.append_step
    monkeypatch.setattr(
        MetricsStore, "append_step", lambda self, step, *a: (steps.append(step), original(self, step, *a))
    )
    assert _watch(arms, timeout=30) == 0
    assert steps == [3, 4]  # steps after 2 recomputed from the new attempt
    assert json.loads((arms / "watch.json").read_text())["attempts"] == {"a": 1, "b": 2}
    assert (arms / "metrics.jsonl").read_bytes() == (trained / "lockstep/metrics.jsonl").read_bytes()


class Crash(Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 3:
            raise SystemError("simulated crash")


def test_an_arm_resumed_after_a_crash_cleans_up_and_the_pair_still_matches_lockstep(arms, trained):
    for path in (arms / "b").iterdir():  # arm b again, from scratch, crashing after step 3
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    with pytest.raises(SystemError):
        train_arm(seed_pair(), "b", arms, callbacks=[Crash()])  # last.ckpt holds step 2
    assert ArmStatus.read(arms / "b").state == "failed"
    assert (arms / "b/checkpoints/step_000003.safetensors").exists()
    train_arm(seed_pair(), "b", arms)
    status = ArmStatus.read(arms / "b")
    assert (status.attempt, status.start_step, status.state) == (2, 2, "finished")
    assert _watch(arms, timeout=30) == 0
    assert (arms / "metrics.jsonl").read_bytes() == (trained / "lockstep/metrics.jsonl").read_bytes()


def test_ema_and_accumulation_give_the_lockstep_store_bitwise(tmp_path):
    """EMA records (ema.* tensors, ema_* summaries) from files equal the lockstep tracker's (2 steps:
    tracked 0 and 2, each from its own accumulated steps)."""
    from divergence.training.lockstep import train_pair

    extra = ("train.ema={decay: 0.5}", "train.accumulate=2", "tracking.probe.enabled=false", "train.max_steps=2")
    train_pair(seed_pair(*extra), tmp_path / "lockstep")
    for arm in "ab":
        train_arm(seed_pair(*extra), arm, tmp_path / "arms")
    assert ArmStatus.read(tmp_path / "arms/a").global_batch == 4
    assert main(["watch", str(tmp_path / "arms"), "--poll", "0.01", "--timeout", "30", "--quiet"]) == 0
    store = (tmp_path / "arms/metrics.jsonl").read_bytes()
    assert store == (tmp_path / "lockstep/metrics.jsonl").read_bytes()
    assert b'"ema_rel_l2"' in store and b'"tensor":"ema.unet.transformer.pos_embed.proj.weight"' in store


def test_the_comparator_of_a_separate_pair_runs_on_the_pairs_cpu_threads(tmp_path, monkeypatch):
    """Its probe's forwards on train.cpu_threads, as a lockstep job's: torch's default (every core)
    oversubscribes the cores of the study's other jobs (6x the comparator's CPU on 2 busy cores)."""
    import torch

    from divergence.comparator import follow
    from divergence.training import separate_pair

    seen = {}

    class Watching:  # records the threads the comparator would compare on
        def __init__(self, out, **kwargs):
            pass

        def run(self, **kwargs) -> int:
            seen["threads"] = torch.get_num_threads()
            return 0

    monkeypatch.setattr(follow, "Comparator", Watching)
    monkeypatch.setattr(separate_pair, "train_separate", lambda pair, out, command, follow, *borrowed: follow(out))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        recipe = "divergence/recipes/pairs/data-parallel.yaml"
        assert main(["train", "--recipe", recipe, "--out", str(tmp_path / "p"), "train.cpu_threads=1"]) == 0
        assert seen["threads"] == 1
    finally:
        torch.set_num_threads(before)
