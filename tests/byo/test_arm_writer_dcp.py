"""``ArmWriter(..., format="dcp")``: each tracked step a DCP folder written by every rank.

The oracle is the same pair written in the default format (rank 0's safetensors of the gathered
weights): ``divergence watch`` and ``divergence track`` must give the same store, every metric of
every tensor. A step folder without its completion marker is never read.
"""

import json
import shutil

import pytest
import torch

from divergence.checkpoints.series import find_series
from divergence.cli import main
from divergence.comparator.feeds import ArmFeed
from divergence.errors import UserInputError
from divergence.pairfolder.layout import CHECKPOINTS_DIR, DCP_COMPLETE_FILE
from divergence.store import MetricsStore
from divergence.writers import ArmWriter
from tests.helpers import assert_one_line_message

from .dcp_arms import EVERY, MAX_STEPS

TRACKED = list(range(0, MAX_STEPS + 1, EVERY))


@pytest.fixture
def arms(gloo_runs):
    """``dcp_arms``' pair folders, written by the session's one gloo spawn (``tests.gloo_runs``)."""
    return gloo_runs / "arms"


def test_a_mismatch_rank_zero_finds_stops_every_rank_before_the_collective_save(arms):
    """Only rank 0 reads the arm's records, so only it can find that step 2's weights lack a tensor; raised
    there alone, rank 1 would wait in the DCP save forever. Both ranks raise the same one line (the spawn
    that wrote this finished: no hang), and no folder of step 2 is written."""
    said = [(arms / "mismatch" / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert said[0] == said[1] and "\n" not in said[0], said
    assert said[0] != "no error" and "step 2" in said[0] and "b" in said[0], said
    assert not (arms / "mismatch" / "a" / CHECKPOINTS_DIR / "step_000002.dcp").exists()


def _watch(out, capsys, *extra):
    code = main(["watch", str(out), "--no-wandb", "--quiet", "--poll", "0.05", "--timeout", "20", *extra])
    return code, capsys.readouterr().err.strip()


def _rows(store):
    tensors = sorted(store.tensor_records(), key=lambda r: (r["step"], r["tensor"]))
    return store.step_records(), tensors


def test_every_rank_writes_its_shards_into_the_step_folder(arms):
    for step in TRACKED:
        folder = arms / "dcp" / "a" / CHECKPOINTS_DIR / f"step_{step:06d}.dcp"
        assert sorted(p.name for p in folder.iterdir()) == [
            ".metadata",
            "__0_0.distcp",
            "__1_0.distcp",
            "complete.json",
        ]
        marker = json.loads((folder / DCP_COMPLETE_FILE).read_text())
        assert (
            marker["step"] == step
            and marker["arm"] == "a"
            and set(marker["files"])
            == {
                ".metadata",
                "__0_0.distcp",
                "__1_0.distcp",
            }
        )
    assert not list((arms / "dcp" / "a" / CHECKPOINTS_DIR).glob("*.safetensors"))  # nothing gathered
    status = json.loads((arms / "dcp" / "a" / "status.json").read_text())
    assert status["state"] == "finished" and status["world_size"] == 2


def test_watch_over_dcp_arms_equals_watch_over_the_same_weights_in_safetensors(arms, tmp_path, capsys):
    dcp, st = tmp_path / "dcp", tmp_path / "st"
    shutil.copytree(arms / "dcp", dcp)
    shutil.copytree(arms / "st", st)
    assert _watch(dcp, capsys) == (0, "")
    assert _watch(st, capsys) == (0, "")
    got, want = _rows(MetricsStore(dcp)), _rows(MetricsStore(st))
    assert [r["step"] for r in got[0] if r["tracked"]] == TRACKED
    assert got == want and len(got[1]) == 9 * len(TRACKED)  # 9 floating-point tensors a step
    assert max(r["max_abs_diff"] for r in got[1] if r["step"] == MAX_STEPS) > 0  # the arms diverged


def test_a_tied_parameter_sharded_over_the_ranks_is_saved_once_as_in_safetensors(arms, tmp_path, capsys):
    """head.weight is wte.weight, its one row on rank 0 and rank 1's shard empty: rank 1 sees no tie by
    itself, so the ranks merge their ties before DCP's save and both drop head.weight. The store equals
    the one of the gathered weights in safetensors (the tie counted once), every record."""
    dcp, st = tmp_path / "dcp", tmp_path / "st"
    shutil.copytree(arms / "tied-dcp", dcp)
    shutil.copytree(arms / "tied-st", st)
    marker = json.loads((dcp / "a" / CHECKPOINTS_DIR / "step_000002.dcp" / DCP_COMPLETE_FILE).read_text())
    assert marker["tied"] == {"wte.weight": ["head.weight"]}
    assert _watch(dcp, capsys) == (0, "")
    assert _watch(st, capsys) == (0, "")
    got, want = _rows(MetricsStore(dcp)), _rows(MetricsStore(st))
    assert got == want and [r["numel"] for r in got[0]] == [12] * 3  # wte (= head) and the LayerNorm's two
    assert sorted({r["tensor"] for r in got[1]}) == ["norm.bias", "norm.weight", "wte.weight"]


def test_track_over_dcp_arm_folders_equals_track_over_safetensors(arms, tmp_path):
    def track(kind):
        a, b = (str(arms / kind / arm / CHECKPOINTS_DIR) for arm in "ab")
        assert main(["track", a, b, "--out", str(tmp_path / kind), "--quiet"]) == 0
        return _rows(MetricsStore(tmp_path / kind))

    got, want = track("dcp"), track("st")
    assert [r["step"] for r in got[0]] == TRACKED and got == want


def _single(out, arm, lr, format="dcp", **options):
    """One process, no process group: DCP's save without collectives."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    with ArmWriter(out, arm, max_steps=4, every=1, dense=[], format=format, **options) as writer:
        writer.record(0, net)
        for step in range(1, 5):
            loss = net(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            writer.record(step, net, loss)


def test_a_step_folder_without_its_marker_is_not_read(tmp_path, capsys):
    _single(tmp_path, "a", 0.1)
    folder = tmp_path / "a" / CHECKPOINTS_DIR / "step_000002.dcp"
    feed = ArmFeed(tmp_path / "a")
    assert feed.checkpoint(2) is not None
    shard = folder / "__0_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[:-1])  # a shard cut short: its size is not the marker's
    assert feed.checkpoint(2) is None
    shard.write_bytes(data)
    assert feed.checkpoint(2) is not None
    (folder / DCP_COMPLETE_FILE).unlink()  # being written (or its writer died): not there yet
    assert feed.checkpoint(2) is None
    assert 2 not in find_series(tmp_path / "a" / CHECKPOINTS_DIR)  # track leaves it out too
    _single(tmp_path, "b", 0.12)
    code, err = _watch(tmp_path, capsys, "--timeout", "1")
    assert code == 1  # waits for step 2's folder of arm a, which never completes
    assert [r["step"] for r in MetricsStore(tmp_path).step_records()] == [0, 1]


def test_keep_deletes_compared_dcp_folders(tmp_path, capsys):
    _single(tmp_path, "a", 0.1, keep=2)
    _single(tmp_path, "b", 0.12, keep=2)
    assert _watch(tmp_path, capsys) == (0, "")
    for arm in "ab":  # tracked 0..4: every 2nd tracked step's folder kept, and the last's
        assert sorted(p.name for p in (tmp_path / arm / CHECKPOINTS_DIR).iterdir()) == [
            "step_000000.dcp",
            "step_000002.dcp",
            "step_000004.dcp",
        ]
    assert [r["step"] for r in MetricsStore(tmp_path).step_records() if r["tracked"]] == list(range(5))


def test_a_restart_removes_the_later_step_folders(tmp_path):
    _single(tmp_path, "a", 0.1)
    with ArmWriter(tmp_path, "a", max_steps=4, every=1, dense=[], format="dcp", start_step=2) as writer:
        assert sorted(p.name for p in (tmp_path / "a" / CHECKPOINTS_DIR).iterdir()) == [
            "step_000000.dcp",
            "step_000001.dcp",
            "step_000002.dcp",
        ]
        writer.finish("failed")


def test_a_bad_format_is_one_line(tmp_path):
    with pytest.raises(UserInputError) as err:
        ArmWriter(tmp_path, "a", max_steps=4, format="torch")
    assert_one_line_message(str(err.value), "format='torch'", "safetensors, dcp")
    assert not any(tmp_path.iterdir())


def test_one_arm_in_dcp_and_the_other_in_safetensors_compare(tmp_path, capsys):
    _single(tmp_path / "mixed", "a", 0.1)
    _single(tmp_path / "mixed", "b", 0.12, format="safetensors")
    _single(tmp_path / "st", "a", 0.1, format="safetensors")
    _single(tmp_path / "st", "b", 0.12, format="safetensors")
    for out in ("mixed", "st"):
        assert _watch(tmp_path / out, capsys) == (0, "")
    assert _rows(MetricsStore(tmp_path / "mixed")) == _rows(MetricsStore(tmp_path / "st"))


@pytest.fixture
def lightning_arms(gloo_runs):
    """``dcp_lightning``'s pair folders, written by the session's one gloo spawn (``tests.gloo_runs``)."""
    return gloo_runs / "lightning"


def test_lightning_model_parallel_arms_in_dcp_equal_the_gathered_weights(lightning_arms, capsys):
    folders = sorted(p.name for p in (lightning_arms / "dcp" / "a" / CHECKPOINTS_DIR).iterdir())
    assert folders == [f"step_{s:06d}.dcp" for s in TRACKED]
    assert sorted(p.name for p in (lightning_arms / "dcp" / "a" / CHECKPOINTS_DIR / folders[-1]).glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]  # each rank its shards
    for kind in ("dcp", "st"):
        assert _watch(lightning_arms / kind, capsys) == (0, "")
    got, want = _rows(MetricsStore(lightning_arms / "dcp")), _rows(MetricsStore(lightning_arms / "st"))
    assert [r["step"] for r in got[0] if r["tracked"]] == TRACKED
    assert got == want and len(got[1]) == 9 * len(TRACKED)
    assert max(r["max_abs_diff"] for r in got[1] if r["step"] == MAX_STEPS) > 0
