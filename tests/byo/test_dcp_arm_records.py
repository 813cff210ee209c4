"""Arms written as DCP folders (``ArmWriter(..., format="dcp")``) that restart, change format, tie
parameters or die mid-save, and the ``retention.json`` that deletes compared weights: a correct store
or one line and exit 2, never a record of other weights, never a file deleted outside the arm's
checkpoints. Each arm is one process without a process group (DCP's save without collectives),
tiny modules, a few steps."""

import json
import os
import shutil

import pytest
import torch

from divergence.cli import main
from divergence.errors import CheckpointError
from divergence.pairfolder import PairFolder
from divergence.pairfolder.layout import CHECKPOINTS_DIR, DCP_COMPLETE_FILE
from divergence.store import MetricsStore
from divergence.writers import ArmWriter
from tests.helpers import assert_one_line_exit2


def watch(out, capsys, timeout=20):
    code = main(["watch", str(out), "--no-wandb", "--quiet", "--poll", "0.02", "--timeout", str(timeout)])
    return code, capsys.readouterr().err.strip().splitlines()


def folder_names(out, arm):
    return sorted(p.name for p in (out / arm / CHECKPOINTS_DIR).iterdir())


def nudge(net, by):
    with torch.no_grad():
        for p in net.parameters():
            p.add_(by)


def test_watch_follows_the_restart_of_a_dcp_arm(tmp_path, capsys):
    """Watch compared both DCP arms to step 4, arm a was restarted from step 2, and watch
    refused it: "arm b's weights files of the compared steps 4 ... are gone", looking for b's
    step_000004.safetensors while b wrote step_000004.dcp/. The same run in safetensors completes."""
    nets, writers = {}, {}
    for arm in "ab":
        torch.manual_seed(0)
        nets[arm] = torch.nn.Linear(2, 2)
        writers[arm] = ArmWriter(tmp_path, arm, format="dcp", max_steps=8, every=2, dense=[], log={"wandb": False})
        writers[arm].record(0, nets[arm])
        for step in range(1, 6):
            nudge(nets[arm], 0.01 if arm == "a" else 0.02)
            writers[arm].record(step, nets[arm], 1.0 / step)
    assert watch(tmp_path, capsys, timeout=1)[0] == 1  # both still run: compared to 5
    assert MetricsStore(tmp_path).steps()[:5] == list(range(5))  # b's step 4 compared
    writers["a"].lock.release()  # arm a's job killed, requeued from its checkpoint of step 2
    restarted = ArmWriter(tmp_path, "a", format="dcp", max_steps=8, every=2, start_step=2, dense=[])
    for step in range(3, 9):
        nudge(nets["a"], 0.03)
        restarted.record(step, nets["a"], 2.0 / step)
    restarted.finish()
    for step in range(6, 9):
        nudge(nets["b"], 0.02)
        writers["b"].record(step, nets["b"], 1.0 / step)
    writers["b"].finish()
    assert watch(tmp_path, capsys) == (0, [])
    records = MetricsStore(tmp_path).step_records()
    assert [r["step"] for r in records] == list(range(9))
    assert [r["loss_a"] for r in records[3:]] == [2.0 / step for step in range(3, 9)]  # the new attempt's


class Tied(torch.nn.Module):
    """A language model's embedding and output layer as one tensor (``head.weight is wte.weight``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.wte = torch.nn.Embedding(10, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.wte.weight


def write_tied(out, arm, format, steps=2):
    net = Tied()
    writer = ArmWriter(out, arm, format=format, max_steps=steps, every=1, dense=[], log={"wandb": False})
    writer.record(0, net)
    for step in range(1, steps + 1):
        nudge(net, 0.01 * step * (1 if arm == "a" else -1))
        writer.record(step, net, 1.0)
    writer.finish()


def last_step(out):
    return [r for r in MetricsStore(out).step_records() if r["step"] == 2][0]


@pytest.mark.parametrize("format_b", ["dcp", "safetensors"])
def test_a_tied_parameter_counts_once_in_dcp_as_in_safetensors(tmp_path, capsys, format_b):
    """With head.weight tied to wte.weight, two DCP arms counted it twice (numel 68
    against 44 in safetensors, another W1), and a DCP arm beside a safetensors arm was refused ("1 only
    in .../step_000000.dcp (head.weight)"). The whole-model figures must not depend on the format."""
    for arm, format in (("a", "dcp"), ("b", format_b)):
        write_tied(tmp_path / "dcp", arm, format)
        write_tied(tmp_path / "st", arm, "safetensors")
    for kind in ("dcp", "st"):
        assert watch(tmp_path / kind, capsys) == (0, [])
    got, want = last_step(tmp_path / "dcp"), last_step(tmp_path / "st")
    assert want["numel"] == 10 * 4 + 4 + 4  # wte (= head), the LayerNorm's weight and bias
    fields = ("numel", "tensors", "wasserstein", "max_abs_diff", "rms_diff", "rel_l2", "cosine")
    assert {k: got[k] for k in fields} == {k: want[k] for k in fields}
    tensors = sorted(r["tensor"] for r in MetricsStore(tmp_path / "dcp").tensor_records() if r["step"] == 2)
    assert tensors == ["norm.bias", "norm.weight", "wte.weight"]


def test_compare_of_a_tied_dcp_folder_with_its_safetensors_file_counts_the_tie_once(tmp_path, capsys):
    """Through ``divergence compare``: a DCP step folder against a safetensors file of the
    same weights: no tensor only on one side, the tie named, nothing differs."""
    write_tied(tmp_path / "mixed", "a", "dcp")
    write_tied(tmp_path / "mixed", "b", "safetensors")
    write_tied(tmp_path / "other", "b", "dcp")  # arm b's weights as DCP: the same weights as mixed/b
    a = tmp_path / "mixed" / "a" / CHECKPOINTS_DIR / "step_000002.dcp"
    b_st = tmp_path / "mixed" / "b" / CHECKPOINTS_DIR / "step_000002.safetensors"
    b_dcp = tmp_path / "other" / "b" / CHECKPOINTS_DIR / "step_000002.dcp"
    assert main(["compare", str(a), str(b_st), "--json", str(tmp_path / "st.json")]) == 0
    assert main(["compare", str(b_dcp), str(b_st), "--json", str(tmp_path / "same.json")]) == 0
    st, same = (json.loads((tmp_path / name).read_text()) for name in ("st.json", "same.json"))
    assert st["summary"]["numel"] == same["summary"]["numel"] == 48
    assert same["summary"]["max_abs_diff"] == 0.0
    assert [r.get("tied") for r in st["tensors"] if r["name"] == "wte.weight"] == [["head.weight"]]


def test_a_step_rewritten_in_safetensors_is_not_shadowed_by_an_old_dcp_folder(tmp_path, capsys):
    """Arm a written as DCP to step 1 and killed, then trained again from step 0 as
    safetensors (resume=True) with other weights: step 0 was stored with max_abs_diff 0.0, read from
    the old DCP folder, where the weights written give 0.5."""
    torch.manual_seed(0)
    net = torch.nn.Linear(2, 2)
    old = ArmWriter(tmp_path, "a", format="dcp", max_steps=2, every=1, dense=[], log={"wandb": False})
    old.record(0, net)
    old.record(1, net, 1.0)
    old.lock.release()  # killed
    with torch.no_grad():
        new = torch.nn.Linear(2, 2)
        new.weight.copy_(net.weight + 0.5)
        new.bias.copy_(net.bias)
    again = ArmWriter(tmp_path, "a", format="safetensors", resume=True, max_steps=2, every=1, dense=[])
    for step in range(3):
        again.record(step, new, None if step == 0 else 1.0)
    again.finish()
    assert folder_names(tmp_path, "a") == [f"step_00000{s}.safetensors" for s in range(3)]  # the old folder gone
    assert PairFolder(tmp_path).arm("a").saved_weights(0).suffix == ".safetensors"
    b = ArmWriter(tmp_path, "b", max_steps=2, every=1, dense=[])
    for step in range(3):
        b.record(step, net, None if step == 0 else 1.0)
    b.finish()
    assert watch(tmp_path, capsys) == (0, [])
    first = MetricsStore(tmp_path).step_records()[0]
    assert first["step"] == 0 and first["max_abs_diff"] == pytest.approx(0.5)


def test_the_newest_of_a_step_file_and_folder_is_the_weights_of_the_step(tmp_path):
    """A folder left by another writer: when a step has both a DCP folder and a safetensors
    file, ``saved_weights`` takes the one written last, not the folder whatever its age."""
    arm = PairFolder(tmp_path).arm("a")
    folder, file = arm.weights_dcp(0), arm.weights(0)
    folder.mkdir(parents=True)
    (folder / DCP_COMPLETE_FILE).write_text("{}")
    file.write_bytes(b"x")
    os.utime(folder / DCP_COMPLETE_FILE, ns=(10**18, 10**18))
    os.utime(folder, ns=(10**18, 10**18))
    os.utime(file, ns=(2 * 10**18, 2 * 10**18))
    assert arm.saved_weights(0) == file
    os.utime(file, ns=(10**17, 10**17))
    assert arm.saved_weights(0) == folder


def test_a_dcp_folder_cut_short_by_a_kill_is_written_again_by_finish(tmp_path, capsys):
    """An open-ended DCP arm killed during finish()'s save left step_000002.dcp/ without its
    complete.json; restarted from step 2, finish(model=m) skipped the save since the folder existed, the
    arm said finished, and watch waited for the folder for ever."""
    torch.manual_seed(0)
    net = torch.nn.Linear(2, 2)
    for arm in "ab":
        writer = ArmWriter(tmp_path, arm, format="dcp", every=5, dense=[], log={"wandb": False})
        writer.record(0, net)
        for step in (1, 2):
            writer.record(step, net, 1.0)
        if arm == "b":
            writer.finish()
            continue
        writer.finish()  # its save of step 2, then the kill: the marker never written, the arm running
        folder = tmp_path / "a" / CHECKPOINTS_DIR / "step_000002.dcp"
        (folder / DCP_COMPLETE_FILE).unlink()
        status = json.loads((tmp_path / "a" / "status.json").read_text())
        (tmp_path / "a" / "status.json").write_text(json.dumps({**status, "state": "running"}))
    restarted = ArmWriter(tmp_path, "a", format="dcp", every=5, dense=[], start_step=2)
    restarted.finish(model=net)
    assert (tmp_path / "a" / CHECKPOINTS_DIR / "step_000002.dcp" / DCP_COMPLETE_FILE).is_file()
    assert watch(tmp_path, capsys, timeout=5) == (0, [])
    assert MetricsStore(tmp_path).steps() == [0, 1, 2]


def two_finished_arms(out, capsys, **options):
    for arm in "ab":
        torch.manual_seed(0)
        net = torch.nn.Linear(2, 2)
        writer = ArmWriter(out, arm, max_steps=2, every=1, dense=[], log={"wandb": False}, **options)
        writer.record(0, net)
        for step in (1, 2):
            nudge(net, 0.01 if arm == "a" else 0.02)
            writer.record(step, net, 1.0)
        writer.finish()
    assert watch(out, capsys) == (0, [])


def stat_of(path):
    st = os.stat(path)
    return [st.st_ino, st.st_size, st.st_mtime_ns]


@pytest.mark.parametrize("keep", [None, 2])
def test_retention_deletes_nothing_outside_the_arms_checkpoints(tmp_path, capsys, keep):
    """A retention.json whose pending entries named an outside file and an outside folder
    (holding a complete.json), with their stat values: watch exited 0 and deleted both (rmtree for the
    folder), with or without tracking.keep. Now it refuses in one line naming retention.json and the entry."""
    out, outside = tmp_path / "pair", tmp_path / "precious"
    two_finished_arms(out, capsys, **({"keep": keep} if keep else {}))
    outside.mkdir()
    (outside / "data.bin").write_bytes(b"keep me")
    folder = outside / "folder"
    folder.mkdir()
    (folder / DCP_COMPLETE_FILE).write_text("{}")
    (folder / "shard").write_bytes(b"x")
    entry = {
        "step": 1,
        "files": {
            "a": [str(outside / "data.bin"), stat_of(outside / "data.bin")],
            "b": [str(folder), stat_of(folder / DCP_COMPLETE_FILE)],
        },
    }
    (out / "retention.json").write_text(json.dumps({"pending": [entry]}))
    code = main(["watch", str(out), "--no-wandb", "--quiet", "--poll", "0.02", "--timeout", "5"])
    assert_one_line_exit2(code, capsys, "retention.json", "data.bin", "step 1")
    assert (outside / "data.bin").read_bytes() == b"keep me"
    assert sorted(p.name for p in folder.iterdir()) == [DCP_COMPLETE_FILE, "shard"]


def test_retention_deletes_no_other_file_of_the_arm(tmp_path, capsys):
    """Inside the pair: an entry naming an arm's losses, or the weights of another step than
    its own, is refused as well; only the arm's own weights of the entry's step are ever deleted."""
    out = tmp_path / "pair"
    two_finished_arms(out, capsys)
    arm = PairFolder(out).arm("a")
    for path in (arm.losses, arm.weights(2)):
        entry = {"step": 1, "files": {"a": [str(path), stat_of(path)]}}
        before = path.read_bytes()
        (out / "retention.json").write_text(json.dumps({"pending": [entry]}))
        code = main(["watch", str(out), "--no-wandb", "--quiet", "--poll", "0.02", "--timeout", "5"])
        assert_one_line_exit2(code, capsys, "retention.json", path.name)
        assert path.read_bytes() == before


def test_a_dcp_folder_of_the_other_arm_is_refused_naming_it(tmp_path, capsys):
    """Minor: arm a's DCP folders copied into arm b were read as b's, a compared with itself."""
    for arm in "ab":
        torch.manual_seed(0)
        net = torch.nn.Linear(2, 2)
        writer = ArmWriter(tmp_path, arm, format="dcp", max_steps=1, every=1, dense=[], log={"wandb": False})
        writer.record(0, net)
        nudge(net, 0.01 if arm == "a" else 0.02)
        writer.record(1, net, 1.0)
        writer.finish()
    shutil.rmtree(tmp_path / "b" / CHECKPOINTS_DIR / "step_000001.dcp")
    shutil.copytree(
        tmp_path / "a" / CHECKPOINTS_DIR / "step_000001.dcp", tmp_path / "b" / CHECKPOINTS_DIR / "step_000001.dcp"
    )
    code = main(["watch", str(tmp_path), "--no-wandb", "--quiet", "--poll", "0.02", "--timeout", "5"])
    assert_one_line_exit2(code, capsys, "b/checkpoints/step_000001.dcp", "arm a")
    assert MetricsStore(tmp_path).steps() == [0]


def test_the_feed_refuses_a_dcp_folder_of_the_other_arm(tmp_path):
    from divergence.comparator.feeds import ArmFeed

    writer = ArmWriter(tmp_path, "a", format="dcp", max_steps=1, every=1, dense=[], log={"wandb": False})
    writer.record(0, torch.nn.Linear(2, 2))
    writer.finish("failed")
    shutil.copytree(tmp_path / "a" / CHECKPOINTS_DIR, tmp_path / "b" / CHECKPOINTS_DIR)
    assert ArmFeed(tmp_path / "a").checkpoint(0) is not None
    with pytest.raises(CheckpointError, match="arm a"):
        ArmFeed(tmp_path / "b").checkpoint(0)


def test_the_stall_of_a_dcp_arm_names_its_step_folder(tmp_path, capsys):
    """Minor: a DCP arm that finished without its folder of a tracked step was said to have no
    step_000001.safetensors."""
    for arm in "ab":
        net = torch.nn.Linear(2, 2)
        writer = ArmWriter(tmp_path, arm, format="dcp", max_steps=2, every=1, dense=[], log={"wandb": False})
        writer.record(0, net)
        for step in (1, 2):
            writer.record(step, net, 1.0)
        writer.finish()
    shutil.rmtree(tmp_path / "a" / CHECKPOINTS_DIR / "step_000001.dcp")
    code = main(["watch", str(tmp_path), "--no-wandb", "--quiet", "--poll", "0.02", "--timeout", "5"])
    assert_one_line_exit2(code, capsys, "it has no a/checkpoints/step_000001.dcp/ (tracked step 1)")


def test_retention_removes_a_linked_step_folder_not_what_it_points_to(tmp_path, capsys):
    """Through a link: arm a's step_000001.dcp is a symbolic link to a folder outside the pair.
    Its note is the arm's own name of the step, so watch deletes it: the link, never the folder's files
    (the marker went first, then rmtree refused the link)."""
    out, outside = tmp_path / "pair", tmp_path / "elsewhere"
    two_finished_arms(out, capsys)
    outside.mkdir()
    (outside / DCP_COMPLETE_FILE).write_text("{}")
    (outside / "shard").write_bytes(b"x")
    link = out / "a" / CHECKPOINTS_DIR / "step_000001.dcp"
    link.symlink_to(outside, target_is_directory=True)
    entry = {"step": 1, "files": {"a": [str(link), stat_of(outside / DCP_COMPLETE_FILE)]}}
    (out / "retention.json").write_text(json.dumps({"pending": [entry]}))
    assert watch(out, capsys) == (0, [])
    assert not link.is_symlink() and not (out / "retention.json").exists()
    assert sorted(p.name for p in outside.iterdir()) == [DCP_COMPLETE_FILE, "shard"]


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_step_marker_that_is_no_small_file_is_refused_not_read(tmp_path, capsys, kind):
    """A step folder's complete.json that is a FIFO (a read would wait for a writer for ever), a link to
    /dev/zero or a file past the marker's bound: watch refuses it in one line naming it; compare, which
    reads a marker only for its ties, leaves it unread and compares the tensors."""
    from divergence.checkpoints.bounds import MAX_MARKER_BYTES

    two_finished_arms(tmp_path / "pair", capsys, format="dcp")
    folder = tmp_path / "pair" / "a" / CHECKPOINTS_DIR / "step_000002.dcp"
    marker = folder / DCP_COMPLETE_FILE
    shutil.copytree(folder, tmp_path / "copy")
    for path in (marker, tmp_path / "copy" / DCP_COMPLETE_FILE):
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "device":
            path.symlink_to("/dev/zero")
        else:
            with open(path, "wb") as f:
                f.truncate(MAX_MARKER_BYTES + 1)
    (tmp_path / "pair" / "metrics.jsonl").unlink()  # compared again from step 0
    code = main(["watch", str(tmp_path / "pair"), "--no-wandb", "--quiet", "--poll", "0.02", "--timeout", "5"])
    assert_one_line_exit2(code, capsys, "step_000002.dcp/complete.json", "not an arm writer's completion marker")
    b = tmp_path / "pair" / "b" / CHECKPOINTS_DIR / "step_000002.dcp"
    assert main(["compare", str(tmp_path / "copy"), str(b)]) == 0
