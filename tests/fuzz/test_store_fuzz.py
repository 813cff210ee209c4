"""Fuzzed stores, loss files and resume files: each is one line and exit code 2, nothing runs, nothing is lost.

Every case starts from a valid synthetic pair folder (the files a real pair leaves, written by
the real writers: ``MetricsStore``, ``LossFile``, ``torch.save``) and breaks one file. Each
command that reads that file (``export``, resuming ``train``, ``train --arm``, ``watch``) must
then exit 2 with one line naming the file (and the line of a store or loss file), leave every
byte of the folder as it was, and run nothing (no new file, a pickled payload never executed).
"""

import io
import json
import os
import pickle
import random
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

from divergence.cli import main
from divergence.store import MetricsStore
from divergence.pairfolder.arm.losses import LossFile
from divergence.training.pair_setup import pair_config, pair_info
from tests.pairs.helpers import PAIR_FAST, PAIRS, pair_recipe
from tests.helpers import assert_one_line_exit2

STEPS = ("train.max_steps=4", "train.checkpoint_every=2", "tracking.every=3")
RNG_SEED = 15
MARKER = "payload-ran"


# -- the valid folder ------------------------------------------------------------------------
def _store(folder: Path) -> None:
    """Steps 0..4, two tensor records each: lines 1-3 step 0, 4-6 step 1, ... 13-15 step 4."""
    store = MetricsStore(folder).open_for_append()
    for step in range(5):
        tensors = [{"tensor": name, "wasserstein": 0.1 * step, "max_abs_diff": 0.2 * step} for name in ("w", "b")]
        store.append_step(step, tensors, {"tracked": True, "loss_a": 1.0 / (step + 1), "loss_b": 1.0})


def _losses(folder: Path) -> None:
    losses = LossFile(folder)
    for step in range(1, 5):
        losses.append(step, 1.0 / step)


@pytest.fixture
def lockstep(tmp_path):
    """A lockstep pair folder as a run leaves it: pair.yaml, pair.json, resume/, the store."""
    out = tmp_path / "lockstep"
    (out / "resume").mkdir(parents=True)
    pair = pair_recipe("seed-vs-seed", *STEPS)
    (out / "pair.yaml").write_text(json.dumps(pair_config(pair)))
    pair_info(pair).write(out)
    _store(out)
    return out


@pytest.fixture
def arms(tmp_path):
    """A separate-job pair folder: pair.yaml, pair.json and each arm's losses."""
    out = tmp_path / "arms"
    out.mkdir()
    pair = pair_recipe("seed-vs-seed", *STEPS)
    (out / "pair.yaml").write_text(json.dumps(pair_config(pair)))
    pair_info(pair).write(out)
    for arm in "ab":
        _losses(out / arm)
    return out


def _train(out, *extra):
    return ["train", "--recipe", str(PAIRS / "seed-vs-seed.yaml"), "--out", str(out), *extra, *PAIR_FAST, *STEPS]


def _watch(out):
    return ["watch", str(out), "--no-wandb", "--quiet", "--poll", "0.01", "--timeout", "5"]


def _snapshot(folder: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(capsys, folder: Path, argv: list, *fragments) -> None:
    """``argv`` exits 2 with one line holding ``fragments``; the folder is byte for byte as it was."""
    before = _snapshot(folder)
    assert_one_line_exit2(main(argv), capsys, *fragments)
    assert _snapshot(folder) == before, f"{argv[0]} changed the folder"


# -- malformed store lines ---------------------------------------------------------------------
def _garbage(rng: random.Random) -> bytes:
    kinds = [
        lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60))).replace(b"\n", b" "),
        lambda: b"[" * rng.randrange(1, 5000),  # nesting deep enough for a RecursionError
        lambda: json.dumps(rng.choice([[], [1, 2], 7, "text", None, True, 1.5])).encode(),
        lambda: json.dumps({"type": rng.choice(["step", "tensor", "weights", None]), "tensor": "w"}).encode(),
        lambda: json.dumps({"type": "step", "step": rng.choice([-1, 1.5, "3", True, None, [3]])}).encode(),
        lambda: b'{"type":"tensor","step":2,"wasserstein":0.1}',  # a tensor record without its tensor
        lambda: b"\x00" * rng.randrange(1, 64),
    ]
    return rng.choice(kinds)()


def _store_cases():
    rng = random.Random(RNG_SEED)
    fixed = [b"[]", b'{"type":"step"}', b"{}", b"not json", b'{"type":"step","step":NaN', b"\xff\xfe"]
    cases = [(f"fixed-{i}", line, rng.randrange(1, 16)) for i, line in enumerate(fixed)]
    cases += [(f"random-{i}", _garbage(rng), rng.randrange(1, 16)) for i in range(14)]
    return cases


@pytest.mark.parametrize("name,line,at", _store_cases(), ids=[c[0] for c in _store_cases()])
def test_a_garbage_store_line_is_one_line_naming_it(lockstep, capsys, tmp_path, name, line, at):
    path = lockstep / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[: at - 1] + [line + b"\n"] + lines[at - 1 :]))  # becomes line `at`
    where = f"{path}: line {at}"
    _refused(capsys, lockstep, ["export", str(lockstep), "--csv", str(tmp_path / "x.csv")], where, "divergence repair")
    assert not (tmp_path / "x.csv").exists()
    _refused(capsys, lockstep, _train(lockstep), where)
    _refused(capsys, lockstep, _watch(lockstep), where)


def test_tears_mid_file_are_errors_not_the_end_of_the_store(lockstep, capsys, tmp_path):
    path = lockstep / "metrics.jsonl"
    original = path.read_bytes()
    rng, checked = random.Random(RNG_SEED), 0
    for _ in range(12):
        lines = original.splitlines(keepends=True)
        at = rng.randrange(1, len(lines) - 1)  # a line with more lines after it: a tear mid-file
        cut = rng.randrange(1, len(lines[at - 1]) - 1)
        torn = lines[at - 1][:cut] + lines[at][rng.randrange(0, len(lines[at]) - 1) :]  # half a line runs into the next
        if _parses(torn):
            continue  # the halves happen to form a record: a loss no reader can see, not a tear to detect
        path.write_bytes(b"".join(lines[: at - 1] + [torn] + lines[at + 1 :]))
        _refused(capsys, lockstep, ["export", str(lockstep), "--csv", str(tmp_path / "x.csv")], f"{path}: line {at}")
        _refused(capsys, lockstep, _train(lockstep), f"{path}: line {at}")
        checked += 1
    assert checked >= 6


def _parses(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except ValueError:
        return False


@pytest.mark.parametrize("step", [0, 2, 4])
def test_a_duplicated_step_block_is_refused_naming_the_step(lockstep, capsys, tmp_path, step):
    path = lockstep / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    block = lines[3 * step : 3 * step + 3]
    path.write_bytes(b"".join(lines[: 3 * step + 3] + block + lines[3 * step + 3 :]))  # the block twice in a row
    duplicate_commit = 3 * step + 6
    _refused(
        capsys,
        lockstep,
        ["export", str(lockstep), "--csv", str(tmp_path / "x.csv")],
        f"line {duplicate_commit}: step {step} is stored twice",
    )
    _refused(capsys, lockstep, _train(lockstep), f"step {step} is stored twice")


def test_a_torn_final_line_is_still_the_uncommitted_tail(lockstep, tmp_path):
    with open(lockstep / "metrics.jsonl", "ab") as f:
        f.write(b'{"type":"tensor","step":5,"tensor":"w","wasser')
    assert main(["export", str(lockstep), "--csv", str(tmp_path / "x.csv")]) == 0
    assert MetricsStore(lockstep).steps() == [0, 1, 2, 3, 4]


# -- malformed loss files -----------------------------------------------------------------------
def _loss_cases():
    rng = random.Random(RNG_SEED + 1)
    fixed = [
        b"[]",
        b"{}",
        b'{"step":2}',
        b'{"step":2,"loss":"low"}',
        b'{"step":-1,"loss":1.0}',
        b'{"step":2,"loss":true}',
        b"garbage",
        b'{"step":1,"loss":1.0}',
    ]  # the last: step 1 again
    cases = [(f"fixed-{i}", line, rng.randrange(2, 5)) for i, line in enumerate(fixed)]
    cases += [(f"random-{i}", _garbage(rng), rng.randrange(1, 5)) for i in range(6)]
    return cases


@pytest.mark.parametrize("name,line,at", _loss_cases(), ids=[c[0] for c in _loss_cases()])
def test_a_garbage_loss_line_is_one_line_naming_it(arms, capsys, name, line, at):
    path = arms / "b" / "losses.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[: at - 1] + [line + b"\n"] + lines[at - 1 :]))
    where = f"{path}: line {at}"
    _refused(capsys, arms, _watch(arms), where)
    _refused(capsys, arms, _train(arms, "--arm", "b"), where)


# -- evil, empty and truncated resume files -------------------------------------------------------
class _Payload:
    """Unpickling this runs ``func(*args)``: the attack a copied-in resume file could carry."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _evil_files(marker: Path):
    touch = f"open({str(marker)!r}, 'w').close()"
    payloads = {
        "os.system": _Payload(os.system, f"touch {marker}"),
        "builtins.exec": _Payload(exec, touch),
        "builtins.eval": _Payload(eval, touch),
        "subprocess.Popen": _Payload(subprocess.Popen, ["touch", str(marker)]),
    }
    for global_name, payload in payloads.items():
        for protocol in (2, 4, 5):
            state = {"state_dict": {"w": torch.zeros(2)}, "epoch": 0, "global_step": 3, "callbacks": payload}
            buffer = io.BytesIO()
            torch.save(state, buffer, pickle_protocol=protocol)
            yield f"{global_name}-p{protocol}", buffer.getvalue(), global_name.split(".")[-1]
    raw = pickle.dumps({"x": _Payload(os.system, f"touch {marker}")}, protocol=2)  # a plain pickle, not a zip
    yield "plain-pickle", raw, "truncated or corrupt"


def _broken_files():
    buffer = io.BytesIO()
    torch.save({"state_dict": {"w": torch.arange(1000.0)}, "epoch": 0, "global_step": 3}, buffer)
    whole = buffer.getvalue()
    rng = random.Random(RNG_SEED + 2)
    yield "zero-bytes", b"", "is empty"
    for i in range(6):
        yield f"truncated-{i}", whole[: rng.randrange(1, len(whole) - 1)], "truncated or corrupt"
    yield "text", b"this is not a checkpoint\n", "truncated or corrupt"
    with zipfile.ZipFile(buffer := io.BytesIO(), "w") as archive:
        archive.writestr("archive/version", "3")
    yield "zip-without-pickle", buffer.getvalue(), "holds no pickle"


def _resume_cases(marker):
    return [*_evil_files(marker), *_broken_files()]


def test_resume_files_that_would_run_code_or_are_broken_are_one_line(lockstep, arms, capsys, tmp_path):
    marker = tmp_path / MARKER
    cases = _resume_cases(marker)
    assert len(cases) > 15
    for name, data, fragment in cases:
        for folder, argv in ((lockstep, _train(lockstep)), (arms / "a", _train(arms, "--arm", "a"))):
            path = folder / "resume" / "last.ckpt"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(data)
            _refused(capsys, folder if folder is lockstep else arms, argv, str(path), fragment)
            assert not marker.exists(), f"{name}: the payload ran"
            path.unlink()
            path.parent.rmdir()


def test_the_evil_payloads_do_run_when_unpickled_without_protection(tmp_path):
    """The oracle for the test above: the payloads are real (each runs under a plain load)."""
    marker = tmp_path / MARKER
    for name, data, _ in _evil_files(marker):
        if name.endswith("p2") or name == "plain-pickle":
            loaded = pickle.loads(data) if name == "plain-pickle" else torch.load(io.BytesIO(data), weights_only=False)
            if name.startswith("subprocess"):
                loaded["callbacks"].wait()
            assert marker.exists(), name
            marker.unlink()
