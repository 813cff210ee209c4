"""Every atomic write is durable: the file is fsynced before its rename, and its folder after it.

``fsync`` is observed (and still done) by wrapping ``os.fsync``; each descriptor is resolved to
the path it names through ``/proc/self/fd``.
"""

import os
from pathlib import Path

import pytest
import torch

from divergence.pairfolder.pair_json import PairInfo
from divergence.pairfolder.arm.weights_file import save_weights
from divergence.pairfolder.arm.status import ArmStatus
from divergence.tables import write_csv, write_json
from divergence.training.checkpoint_io import AtomicCheckpointIO, load_resume_state

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="resolves descriptors via /proc")


@pytest.fixture
def fsynced(monkeypatch):
    """The paths fsynced during the test, in order (a file fsynced under its temporary name is
    recorded under that name)."""
    seen, real = [], os.fsync

    def spy(fd):
        seen.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return seen


def _durable(seen, path: Path) -> None:
    """``path``'s data was fsynced (under its temporary name: ``.NAME.tmp-PID``) and then its folder."""
    data = [i for i, p in enumerate(seen) if p.parent == path.parent and p.name.startswith(f".{path.name}.tmp-")]
    folder = [i for i, p in enumerate(seen) if p == path.parent]
    assert data and folder and folder[-1] > data[-1], (path, seen)
    assert path.is_file() and not list(path.parent.glob(f".{path.name}.tmp-*"))


def test_every_atomic_write_fsyncs_the_file_and_its_folder(tmp_path, fsynced):
    write_json(tmp_path / "summary.json", {"a": 1})
    write_csv(tmp_path / "rows.csv", [{"x": 1.5}], ["x"])
    PairInfo(name="p", category="control", arms={"a": [], "b": []}).write(tmp_path)
    ArmStatus(arm="a").write(tmp_path)
    save_weights(tmp_path / "w" / "step_000000.safetensors", {"w": torch.ones(3)}, step=0, arm="a", recipe={})
    AtomicCheckpointIO().save_checkpoint(
        {"state_dict": {"w": torch.ones(2)}, "global_step": 1}, tmp_path / "resume" / "last.ckpt"
    )
    for name in (
        "summary.json",
        "rows.csv",
        "pair.json",
        "status.json",
        "w/step_000000.safetensors",
        "resume/last.ckpt",
    ):
        _durable(fsynced, (tmp_path / name).resolve())
    assert load_resume_state(tmp_path / "resume" / "last.ckpt")["global_step"] == 1


def test_a_failed_write_leaves_no_temporary_file(tmp_path):
    from divergence.errors import UserInputError

    def rows():
        yield {"x": 1}
        raise UserInputError("the store became unreadable mid-export")

    with pytest.raises(UserInputError, match="unreadable mid-export"):
        write_csv(tmp_path / "rows.csv", rows(), ["x"])
    assert list(tmp_path.iterdir()) == []
