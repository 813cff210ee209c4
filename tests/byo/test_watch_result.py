"""What ``divergence watch`` leaves on the terminal: a summary line and the next command, even with ``--quiet``."""

import torch

from divergence.cli import main
from divergence.cli.watch import NEEDS
from divergence.store import MetricsStore
from divergence.writers import ArmWriter


def two_arms(out, steps=6, every=2, **pair):
    """Two tiny linear models, arm b with another learning rate, written with ``ArmWriter``."""
    for arm, lr in (("a", 0.1), ("b", 0.1001)):
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(net.parameters(), lr=lr)
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
        with ArmWriter(out, arm, max_steps=steps, every=every, dense=[], **pair) as writer:
            writer.record(0, net)
            for step in range(1, steps + 1):
                loss = net(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                writer.record(step, net, loss)


def test_quiet_watch_prints_the_result_line_only(tmp_path, capsys):
    out = tmp_path / "pair"
    two_arms(out)
    capsys.readouterr()
    assert main(["watch", str(out), "--no-wandb", "--quiet", "--poll", "0.05", "--timeout", "30"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    lines = captured.out.splitlines()
    assert len(lines) == 1, lines
    last = MetricsStore(out).step_records()[-1]
    assert lines[0].startswith(f"{out}: 7 steps stored (4 compared); step 6: max_abs_diff ")
    assert f"max_abs_diff {last['max_abs_diff']:.4g};" in lines[0]
    # one pair folder alone: a report of it could decide nothing, so the line says what a verdict needs
    assert lines[0].endswith(f" s; next: {NEEDS}") and "a reordering pair" in NEEDS


def test_watch_with_its_progress_bar_ends_with_the_same_line(tmp_path, capsys):
    two_arms(tmp_path / "pair")
    capsys.readouterr()
    assert main(["watch", str(tmp_path / "pair"), "--no-wandb", "--poll", "0.05", "--timeout", "30"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"next: {NEEDS}")


def test_a_pair_beside_a_precision_pair_is_told_to_report_their_folder(tmp_path, capsys):
    two_arms(tmp_path / "bf16", name="bf16", category="precision")
    two_arms(tmp_path / "change", name="change", category="optimization")
    assert main(["watch", str(tmp_path / "change"), "--no-wandb", "--quiet", "--poll", "0.05", "--timeout", "30"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"next: divergence report {tmp_path.resolve()}")


def test_a_second_watch_of_one_pair_is_refused_in_one_line_and_the_store_is_stored_once(tmp_path, capsys):
    """Two comparators of one pair would append every step twice: while one holds the pair folder's lock, a
    second ``divergence watch`` gets one line and exit 2 and writes nothing; once it is done, a watch runs
    (and stores nothing twice)."""
    from divergence.comparator.follow import Comparator

    two_arms(tmp_path)
    first = Comparator(tmp_path, log=False, progress=False)  # holds the lock from here
    capsys.readouterr()
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["watch", str(tmp_path), "--no-wandb", "--quiet", "--poll", "0.05", "--timeout", "30"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another divergence watch already follows this pair" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no lock file left behind
    assert str(tmp_path) in err and "let it finish, or stop it" in err
    assert first.run(poll=0.05, timeout=30) == 0  # the first finishes the store, and releases the lock
    assert main(["watch", str(tmp_path), "--no-wandb", "--quiet", "--poll", "0.05", "--timeout", "30"]) == 0
    steps = [r["step"] for r in MetricsStore(tmp_path).step_records()]
    assert steps == list(range(7))  # every step once
