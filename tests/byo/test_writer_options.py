"""``ArmWriter``'s options for other people's loops: ``global_batch=`` across world sizes, ``keep=``
retention applied by ``watch``, and a naive re-run (diffusers' ``--resume_from_checkpoint``
without ``start_step``) refused without touching a record."""

import json

import pytest
import torch

from divergence.cli import main
from divergence.errors import UserInputError
from divergence.pairfolder.layout import CHECKPOINTS_DIR, LOSSES_FILE
from divergence.store import MetricsStore
from divergence.writers import ArmWriter


def train(out, arm, steps=6, lr=0.1, start=0, net=None, **options):
    torch.manual_seed(0)
    net = net or torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    with ArmWriter(out, arm, max_steps=steps, every=1, dense=[], start_step=start, **options) as writer:
        if start == 0:
            writer.record(0, net)
        for step in range(start + 1, steps + 1):
            loss = net(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            writer.record(step, net, loss)
    return net


def watch(out, capsys):
    code = main(["watch", str(out), "--no-wandb", "--quiet", "--poll", "0.05", "--timeout", "20"])
    return code, capsys.readouterr().err.strip()


def test_two_ranks_of_2_and_one_rank_of_4_are_one_pair_by_global_batch(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    train(tmp_path, "a", global_batch=4)
    monkeypatch.setenv("WORLD_SIZE", "1")
    train(tmp_path, "b", lr=0.1001, global_batch=4)
    assert json.loads((tmp_path / "a" / "status.json").read_text())["global_batch"] == 4
    assert watch(tmp_path, capsys) == (0, "")
    assert MetricsStore(tmp_path).steps() == list(range(7))


@pytest.mark.parametrize(
    "batches, says",
    [((None, None), "different world sizes (arm a: 2, arm b: 1)"), ((4, 8), "different global batches")],
)
def test_other_batches_are_refused_by_watch(tmp_path, capsys, monkeypatch, batches, says):
    monkeypatch.setenv("WORLD_SIZE", "2")
    train(tmp_path, "a", global_batch=batches[0])
    monkeypatch.setenv("WORLD_SIZE", "1")
    train(tmp_path, "b", global_batch=batches[1])
    code, err = watch(tmp_path, capsys)
    assert code == 2 and says in err


@pytest.mark.parametrize("value", [0, -1, 2.0, True])
def test_a_bad_global_batch_is_one_line(tmp_path, value):
    with pytest.raises(UserInputError, match=r"global_batch=.*: must be an integer >= 1"):
        ArmWriter(tmp_path, "a", max_steps=3, global_batch=value)
    assert not (tmp_path / "pair.json").exists()


def test_keep_lets_watch_delete_what_it_compared(tmp_path, capsys):
    train(tmp_path, "a", keep=2)
    train(tmp_path, "b", lr=0.1001, keep=2)
    assert json.loads((tmp_path / "pair.json").read_text())["tracking"]["keep"] == 2
    assert watch(tmp_path, capsys) == (0, "")
    for arm in "ab":  # tracked 0..6: every 2nd tracked step's files kept, and the last's
        kept = sorted(int(p.stem[5:]) for p in (tmp_path / arm / CHECKPOINTS_DIR).iterdir())
        assert kept == [0, 2, 4, 6]
    assert [r["step"] for r in MetricsStore(tmp_path).step_records() if r["tracked"]] == list(range(7))


def test_keep_must_agree_and_be_a_count(tmp_path):
    train(tmp_path, "a", keep=2)
    with pytest.raises(UserInputError, match="the pair has keep=2, this arm keep=3"):
        ArmWriter(tmp_path, "b", max_steps=6, every=1, dense=[], keep=3)
    with pytest.raises(UserInputError, match=r"keep=-1: must be an integer >= 0"):
        ArmWriter(tmp_path / "other", "a", max_steps=6, keep=-1)


def test_without_keep_every_file_stays(tmp_path, capsys):
    train(tmp_path, "a")
    train(tmp_path, "b", lr=0.1001)
    assert watch(tmp_path, capsys) == (0, "")
    assert len(list((tmp_path / "a" / CHECKPOINTS_DIR).iterdir())) == 7


def test_a_naive_resume_is_refused_and_touches_nothing(tmp_path):
    """diffusers' --resume_from_checkpoint without start_step: record(0) again, with resumed weights."""
    net = train(tmp_path, "a", steps=6)
    before = {p: p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file() and p.name != "writer.lock"}
    with pytest.raises(UserInputError, match="start_step"):
        writer = ArmWriter(tmp_path, "a", max_steps=6, every=1, dense=[])
        writer.record(0, net)  # the resumed weights as step 0
    after = {p: p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file() and p.name != "writer.lock"}
    assert after == before


def test_a_resume_at_step_n_keeps_every_earlier_record(tmp_path):
    train(tmp_path, "a", steps=6)
    folder = tmp_path / "a"
    early = {p.name: p.read_bytes() for p in (folder / CHECKPOINTS_DIR).iterdir() if int(p.stem[5:]) <= 3}
    lines = (folder / LOSSES_FILE).read_text().splitlines()
    net = torch.nn.Linear(4, 3)
    train(tmp_path, "a", steps=6, start=3, net=net)
    assert {n: (folder / CHECKPOINTS_DIR / n).read_bytes() for n in early} == early
    assert (folder / LOSSES_FILE).read_text().splitlines()[:3] == lines[:3]
    assert json.loads((folder / "status.json").read_text())["attempt"] == 2


def test_a_resume_past_the_recorded_steps_is_refused_at_construction(tmp_path):
    """Records that end at 3 and ``start_step=5`` would leave steps 4-5 a gap
    that watch finds only when the arm ends; the writer refuses it in one line, touching nothing."""
    with pytest.raises(RuntimeError):
        with ArmWriter(tmp_path, "a", max_steps=6, every=1, dense=[]) as writer:
            net = torch.nn.Linear(2, 2)
            writer.record(0, net)
            for step in (1, 2, 3):
                writer.record(step, net, 0.5)
            raise RuntimeError("killed")
    before = {p: p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file() and p.name != "writer.lock"}
    with pytest.raises(UserInputError) as err:
        ArmWriter(tmp_path, "a", max_steps=6, every=1, dense=[], start_step=5)
    assert "\n" not in str(err.value)
    assert "start_step=5, but arm a's records (losses.jsonl) end at step 3" in str(err.value)
    after = {p: p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file() and p.name != "writer.lock"}
    assert after == before
    ArmWriter(tmp_path, "a", max_steps=6, every=1, dense=[], start_step=3).finish("failed")  # at 3: a resume
