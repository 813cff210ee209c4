"""``ArmWriter(out, arm)`` without ``max_steps``: a loop that does not know its length (epochs over
a stream, an early stop). The last step is where ``finish()`` is called; ``watch`` ends the pair
there and stores what it would have stored had the length been given."""

import json

import pytest
import torch

from divergence.cli import main
from divergence.errors import UserInputError
from divergence.pairfolder.layout import CHECKPOINTS_DIR
from divergence.store import MetricsStore
from divergence.writers import ArmWriter


def train(out, arm, steps=7, lr=0.1, state_dicts=False, **options):
    """SGD on a linear layer for ``steps`` steps; the writer is not told ``steps`` unless in ``options``."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    weights = (lambda: {k: v.clone() for k, v in net.state_dict().items()}) if state_dicts else (lambda: net)
    with ArmWriter(out, arm, every=3, dense=[], log={"wandb": False}, **options) as writer:
        writer.record(0, weights())
        for step in range(1, steps + 1):
            loss = net(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            writer.record(step, weights() if writer.tracked(step) else None, loss)
    return net


def watch(out, capsys):
    code = main(["watch", str(out), "--no-wandb", "--quiet", "--poll", "0.05", "--timeout", "20"])
    return code, capsys.readouterr().err.strip()


def saved_steps(folder):
    return sorted(int(p.stem[5:]) for p in (folder / CHECKPOINTS_DIR).iterdir())


def test_the_last_step_is_where_finish_is_called(tmp_path, capsys):
    open_, known = tmp_path / "open", tmp_path / "known"
    for out, options in ((open_, {}), (known, {"max_steps": 7})):
        train(out, "a", **options)
        assert json.loads((out / "pair.json").read_text())["max_steps"] == options.get("max_steps")
        train(out, "b", lr=0.1001, **options)
        assert watch(out, capsys) == (0, "")
    assert saved_steps(open_ / "a") == [0, 3, 6, 7]  # the schedule's, and the last saved by finish()
    info = json.loads((open_ / "pair.json").read_text())
    assert (info["max_steps"], info["last_step"], info["finished"]) == (7, 7, True)
    assert json.loads((open_ / "a" / "status.json").read_text())["state"] == "finished"
    same = MetricsStore(known).step_records(), MetricsStore(open_).step_records()
    assert [r["step"] for r in same[1] if r["tracked"]] == [0, 3, 6, 7]
    assert same[0] == same[1]  # record for record what a writer told its length stores


def test_keep_keeps_the_last_step_of_an_open_pair(tmp_path, capsys):
    train(tmp_path, "a", steps=10, keep=2)
    train(tmp_path, "b", steps=10, lr=0.1001, keep=2)
    assert watch(tmp_path, capsys) == (0, "")
    for arm in "ab":  # tracked 0, 3, 6, 9, 10: the 0th and 2nd kept, and the last
        assert saved_steps(tmp_path / arm) == [0, 6, 10]


def test_arms_that_end_at_different_steps_are_one_line(tmp_path, capsys):
    train(tmp_path, "a", steps=5)
    train(tmp_path, "b", steps=7, lr=0.1001)
    code, err = watch(tmp_path, capsys)
    assert code == 2 and "arm a finished at step 5, before step 6" in err
    assert len(err.splitlines()) == 1


def test_a_stale_state_dict_is_not_saved_as_the_last_step(tmp_path):
    """Copies handed to record at tracked steps: finish cannot know the last step's weights."""
    with pytest.raises(UserInputError, match=r"last step 7 is compared .* finish\(model=...\)"):
        train(tmp_path, "a", state_dicts=True)
    assert json.loads((tmp_path / "a" / "status.json").read_text())["state"] == "failed"
    assert saved_steps(tmp_path / "a") == [0, 3, 6]


def test_finish_takes_the_model(tmp_path):
    net = torch.nn.Linear(2, 2)
    writer = ArmWriter(tmp_path, "a", every=5, dense=[])
    writer.record(0, net)
    writer.record(1, None, 0.5)
    writer.finish(model=net.state_dict())
    assert saved_steps(tmp_path / "a") == [0, 1]
    status = json.loads((tmp_path / "a" / "status.json").read_text())
    assert (status["state"], status["last_step"], status["max_steps"]) == ("finished", 1, None)


def test_an_arm_that_recorded_only_step_0_has_failed(tmp_path):
    writer = ArmWriter(tmp_path, "a")
    writer.record(0, torch.nn.Linear(2, 2))
    writer.finish()
    assert json.loads((tmp_path / "a" / "status.json").read_text())["state"] == "failed"


def test_an_arm_told_its_length_joins_only_a_pair_of_that_length(tmp_path):
    train(tmp_path, "a")  # open-ended
    with pytest.raises(UserInputError, match="the pair has max_steps=None, this arm max_steps=7"):
        ArmWriter(tmp_path, "b", max_steps=7, every=3, dense=[])


def test_arms_that_failed_end_nothing(tmp_path, capsys):
    """Both arms crashed after step 3: the steps they wrote are stored, step 4 is a stall (exit 2),
    and the pair is not marked finished at a crash."""
    for arm, lr in (("a", 0.1), ("b", 0.1001)):
        with pytest.raises(RuntimeError, match="crash"):
            with ArmWriter(tmp_path, arm, every=3, dense=[]) as writer:
                net = torch.nn.Linear(2, 2)
                writer.record(0, net)
                for step in (1, 2, 3):
                    writer.record(step, net if writer.tracked(step) else None, lr * step)
                raise RuntimeError("crash")
    code, err = watch(tmp_path, capsys)
    assert code == 2 and "arm a failed at step 3, before step 4" in err
    assert MetricsStore(tmp_path).steps() == [0, 1, 2, 3]
    info = json.loads((tmp_path / "pair.json").read_text())
    assert (info["max_steps"], info["finished"]) == (None, False)


def resume(out, arm, start, steps, lr=0.1):
    """The arm restarted from its weights file of step ``start`` (plain SGD: no optimizer state),
    trained on to ``steps``, open-ended."""
    from safetensors.torch import load_file

    net = torch.nn.Linear(4, 3)
    net.load_state_dict(load_file(str(out / arm / CHECKPOINTS_DIR / f"step_{start:06d}.safetensors")))
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    with ArmWriter(out, arm, every=3, dense=[], log={"wandb": False}, start_step=start) as writer:
        for step in range(start + 1, steps + 1):
            loss = net(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            writer.record(step, net, loss)


def test_a_finished_open_pair_trained_on_is_followed_to_its_new_end(tmp_path, capsys):
    """Watch finished the open pair at 5 and wrote max_steps 5; both arms then
    resumed at 3 and trained to 8, and a second watch marked the pair finished at 5 (steps 6-8 never
    stored). The length is read from the arms at every look: the second watch follows them to 8."""
    out, whole = tmp_path / "resumed", tmp_path / "whole"
    for arm, lr in (("a", 0.1), ("b", 0.1001)):
        train(out, arm, steps=5, lr=lr)
        train(whole, arm, steps=8, lr=lr)
    assert watch(out, capsys) == (0, "") and watch(whole, capsys) == (0, "")
    assert json.loads((out / "pair.json").read_text())["max_steps"] == 5
    for arm, lr in (("a", 0.1), ("b", 0.1001)):
        resume(out, arm, 3, 8, lr=lr)
    assert watch(out, capsys) == (0, "")
    info = json.loads((out / "pair.json").read_text())
    assert (info["max_steps"], info["last_step"], info["finished"], info["open_ended"]) == (8, 8, True, True)
    assert MetricsStore(out).step_records() == MetricsStore(whole).step_records()  # as if trained in one go


def test_finish_finished_saves_the_last_steps_weights(tmp_path, capsys):
    """An open-ended ``finish("finished", model=net)`` marked the arm finished
    without its last step's weights (step 4, off the every-3 schedule), and watch exited 2."""
    for arm in "ab":
        net = torch.nn.Linear(2, 2)
        writer = ArmWriter(tmp_path, arm, every=3, dense=[], log={"wandb": False})
        writer.record(0, net)
        for step in (1, 2, 3, 4):
            writer.record(step, net.state_dict() if writer.tracked(step) else None, 0.5 * step)
        writer.finish("finished", model=net)
        assert saved_steps(tmp_path / arm) == [0, 3, 4]
    assert watch(tmp_path, capsys) == (0, "")
    assert [r["step"] for r in MetricsStore(tmp_path).step_records() if r["tracked"]] == [0, 3, 4]
