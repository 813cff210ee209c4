"""Resume never runs code or loses records; watch never hangs or reads half a file; --out problems are one line."""

import json
import os
import shutil
import subprocess
import threading
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from divergence.cli import main
from divergence.comparator.follow import Comparator
from divergence.training.probe_files import FileProbe
from divergence.errors import CheckpointError, UserInputError
from divergence.pairfolder.arm.weights_file import read_metadata, save_weights
from divergence.store import MetricsStore
from divergence.training.checkpoint_io import RESUME_GLOBALS, AtomicCheckpointIO, _pickle_globals, load_resume_state
from tests.pairs.helpers import PAIR_FAST, PAIRS
from tests.helpers import assert_one_line

from .conftest import STEPS


def _train(out, *extra):
    return ["train", "--recipe", str(PAIRS / "seed-vs-seed.yaml"), "--out", str(out), *PAIR_FAST, *STEPS, *extra]


def _bounded(seconds, fn, *args, **kwargs):
    """``fn(*args)``'s result, or a failure (not a hung test) when it runs past ``seconds``."""
    result = []
    worker = threading.Thread(target=lambda: result.append(fn(*args, **kwargs)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s"
    return result[0]


def _watch(out, **kwargs):
    return Comparator(out, log=False, progress=False, probe=FileProbe).run(poll=0.01, **kwargs)


# -- resume state ---------------------------------------------------------------------------------
def test_our_resume_state_names_only_allowed_globals_and_loads_safely(trained):
    for path in (trained / "lockstep/resume/last.ckpt", trained / "arms/a/resume/last.ckpt"):
        names = set(_pickle_globals(path))
        assert names and names <= RESUME_GLOBALS, names - RESUME_GLOBALS
        state = load_resume_state(path)
        assert state["global_step"] == 4 and "divergence" in state


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_resume_file_that_would_run_code_is_refused_and_never_runs(trained, tmp_path, capsys):
    """The issue's case: a copied-in pair folder whose last.ckpt holds a __reduce__ payload ran it."""
    out, marker = tmp_path / "copied", tmp_path / "payload-ran"
    shutil.copytree(trained / "lockstep", out)
    state = torch.load(out / "resume/last.ckpt", weights_only=False)  # our own file: trusted here
    state["callbacks"]["Evil"] = _Payload(marker)
    torch.save(state, out / "resume/last.ckpt")
    store = (out / "metrics.jsonl").read_bytes()
    assert main(_train(out)) == 2
    assert_one_line(capsys, "resume/last.ckpt: refused: its pickle references posix.system")
    with pytest.raises(UserInputError, match="posix.system"):  # Lightning's own load path, too
        AtomicCheckpointIO().load_checkpoint(out / "resume/last.ckpt")
    assert not marker.exists() and (out / "metrics.jsonl").read_bytes() == store


def test_an_empty_or_truncated_resume_file_is_one_line(trained, tmp_path, capsys):
    out = tmp_path / "copied"
    shutil.copytree(trained / "lockstep", out)
    whole = (out / "resume/last.ckpt").read_bytes()
    for data, says in ((b"", "is empty (0 bytes)"), (whole[: len(whole) // 3], "is truncated or corrupt")):
        (out / "resume/last.ckpt").write_bytes(data)
        assert main(_train(out)) == 2
        assert_one_line(capsys, "last.ckpt: resume state " + says, "train into a new --out")


def test_a_garbage_line_in_a_real_store_stops_the_resume_and_repair_recovers_every_step(trained, tmp_path, capsys):
    """The issue's case: the resume cut the store at the garbage line (steps 3-6 deleted)."""
    out = tmp_path / "copied"
    shutil.copytree(trained / "lockstep", out)
    path = out / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if b'"type":"step","step":1,' in line) + 2  # after step 1
    path.write_bytes(b"".join(lines[: at - 1] + [b"garbage\n"] + lines[at - 1 :]))
    damaged = path.read_bytes()
    assert main(_train(out)) == 2
    assert_one_line(capsys, f"metrics.jsonl: line {at}: not JSON", f"divergence repair {out}")
    assert path.read_bytes() == damaged
    assert main(["repair", str(out)]) == 0
    assert path.read_bytes() == (trained / "lockstep/metrics.jsonl").read_bytes()
    assert next(out.glob("metrics.jsonl.unreadable-*")).read_bytes() == b"garbage\n"
    assert main(_train(out)) == 0  # resumes (at its last step) and keeps every record
    assert MetricsStore(out).steps() == [0, 1, 2, 3, 4]


# -- watch ---------------------------------------------------------------------------------------
def _rewrite(path, drop=()):
    """Rewrite a weights file with the real writer, leaving out the tensors ``drop``."""
    metadata = read_metadata(path)
    tensors = {k: v for k, v in load_file(path).items() if k not in drop}
    save_weights(path, tensors, step=int(metadata["step"]), arm=metadata["arm"], recipe=json.loads(metadata["recipe"]))


def test_an_unmatchable_checkpoint_pair_is_an_error_naming_the_tensor(arms, capsys):
    """The issue's case: treated as "file went away, retry", it ran for 10 minutes with --timeout 8."""
    path = arms / "b/checkpoints/step_000002.safetensors"
    dropped = sorted(load_file(path))[-1]
    _rewrite(path, drop=[dropped])
    assert _bounded(60, _watch, arms, timeout=30) == 2
    assert_one_line(capsys, "step 2: the arms' checkpoints cannot be compared", dropped)
    assert MetricsStore(arms).last_step() == 1


def test_timeout_counts_from_the_last_progress_even_while_a_step_is_retried(arms, capsys, monkeypatch):
    """An arm that replaces a file during every read makes the step retry forever: no progress."""
    import divergence.comparator.distributed as measurer

    def replaced_mid_read(path_a, path_b, *args, **kwargs):
        _rewrite(path_b)  # a new file under the name, as a restarted arm writes it
        raise CheckpointError(f"{path_b}: tensor 'x' is truncated")

    monkeypatch.setattr(measurer, "compare_files", replaced_mid_read)
    started = time.monotonic()
    assert _bounded(60, _watch, arms, timeout=1) == 1
    assert time.monotonic() - started < 30
    assert_one_line(capsys, "timed out: no progress for 1 s at step 0")


def test_a_preallocated_checkpoint_is_read_only_once_filled(arms, trained):
    """The issue's case: a file written at full size first, then filled, was read half-written (the
    control pair stored max_abs_diff 1.00 at a step that is 0)."""
    path = arms / "b/checkpoints/step_000003.safetensors"
    full = path.read_bytes()
    data_start = 8 + int.from_bytes(full[:8], "little")
    path.write_bytes(full[:data_start] + bytes(len(full) - data_start))  # header and size final, data zeros
    assert _watch(arms, timeout=0.5) == 1
    assert MetricsStore(arms).last_step() == 2
    with open(path, "r+b") as f:  # filled in place
        f.seek(data_start)
        f.write(full[data_start:])
    assert _watch(arms, timeout=30) == 0
    assert (arms / "metrics.jsonl").read_bytes() == (trained / "lockstep/metrics.jsonl").read_bytes()


def test_a_checkpoint_without_a_completion_marker_is_an_error(arms, capsys):
    path = arms / "a/checkpoints/step_000002.safetensors"
    metadata = {k: v for k, v in read_metadata(path).items() if not k.startswith("data_")}
    save_file(load_file(path), path, metadata=metadata)  # another writer: complete, but it cannot say so
    assert _bounded(60, _watch, arms, timeout=30) == 2
    assert_one_line(capsys, "step_000002.safetensors: no completion marker")


# -- --out ---------------------------------------------------------------------------------------
def test_an_arm_trains_into_a_fresh_folder_with_the_default_logging(tmp_path, monkeypatch):
    """The issue's case: FileNotFoundError: NEW/a/wandb-id (the folder was not created first)."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    out = tmp_path / "new"
    argv = [*_train(out, "train.max_steps=1", "log.wandb=true"), "--arm", "a"]
    assert main(argv) == 0
    assert (out / "a/wandb-id").is_file() and list(out.glob("a/wandb/offline-run-*"))
    assert (out / "a/losses.jsonl").read_text().count("\n") == 1


def _immutable(folder):
    folder.mkdir()
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)]).returncode != 0:
        pytest.skip("chattr +i is not available here (needs CAP_LINUX_IMMUTABLE and a supporting filesystem)")


def test_an_immutable_out_is_one_line(tmp_path, capsys):
    folder = tmp_path / "immutable"
    _immutable(folder)
    try:
        for out in (folder, folder / "run"):
            assert (
                main(
                    [
                        "train",
                        "--out",
                        str(out),
                        *[o for o in PAIR_FAST if not o.startswith("tracking.")],
                        "train.max_steps=1",
                    ]
                )
                == 2
            )
            assert_one_line(capsys, f"--out {out}: cannot write there", "choose a folder you can write to")
        assert list(folder.iterdir()) == []
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
