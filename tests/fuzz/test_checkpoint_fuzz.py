"""Generated malformed checkpoints: every one is exit 2 with one line naming the file, and nothing runs.

Four generators, each seeded so a failure reproduces:

- safetensors headers: a valid file's header mutated field by field (dtypes, shapes, offsets,
  lengths, nesting, duplicate keys) plus random bytes; the reference library
  (``safetensors.safe_open``) is the oracle: whatever it refuses, ``compare`` must refuse;
- torch pickles: a valid ``torch.save`` archive with its ``data.pkl`` bit-flipped, cut, or
  spliced with code-running opcodes, and the legacy format cut at random points;
- shard indexes: ``weight_map`` values of every JSON type, paths outside the folder, nesting;
- state dicts (valid files): names under wrapper components that may collide once dropped, and
  entries that are not tensors; read (the rest listed as skipped) or refused in one line.

Every case runs ``divergence compare FILE FILE`` in-process with a marker folder that any
unpickled payload would create.
"""

import json
import os
import pickle
import random
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from divergence.cli import main

from ..checkpoints.forge import RunsCode, rewrite_torch_zip, write_safetensors

CASES = 40  # per generator; the whole file runs in a few seconds


def _compare(path, capsys) -> tuple[int, list[str]]:
    code = main(["compare", str(path), str(path), "--quiet"])
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines()


def _assert_refused(path, capsys, marker=None):
    code, err = _compare(path, capsys)
    assert code == 2, (path, err)
    assert len(err) == 1 and err[0].startswith("divergence compare: error:"), err
    assert str(path.name) in err[0] or str(path.parent.name) in err[0], err
    assert marker is None or not marker.exists()


# --- safetensors ------------------------------------------------------------------------------


def _valid_header():
    return {
        "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "I64", "shape": [1], "data_offsets": [16, 24]},
    }


_BAD_VALUES = [-1, 2**64, 2**70, 1.5, "3", None, True, [], {}, [1, 2, 3], "F32", float("inf")]


def _mutate_header(rng: random.Random) -> bytes:
    header = _valid_header()
    entry = header[rng.choice("ab")]
    choice = rng.randrange(8)
    if choice == 0:
        entry["dtype"] = rng.choice(["F31", "", "f32", 7, None, "U128", "F8_E8M0X"])
    elif choice == 1:
        entry["shape"][rng.randrange(len(entry["shape"]))] = rng.choice(_BAD_VALUES)
    elif choice == 2:
        entry["data_offsets"][rng.randrange(2)] = rng.choice(_BAD_VALUES + [4, 8, 20, 23, 25])
    elif choice == 3:
        del entry[rng.choice(list(entry))]
    elif choice == 4:
        entry["shape"] = rng.choice(_BAD_VALUES)
    elif choice == 5:
        header["__metadata__"] = rng.choice([{"k": 1}, [1], "x", {"k": None}])
    elif choice == 6:
        depth = rng.choice([2000, 50_000])
        return b'{"a":' * depth + b"0" + b"}" * depth
    else:
        text = json.dumps(header)
        return text.replace('"b"', '"a"').encode()  # a duplicate name
    return json.dumps(header, allow_nan=True).encode()


def _reference_accepts(path) -> bool:
    try:
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                f.get_tensor(key)
        return True
    except Exception:  # noqa: BLE001 - any refusal by the reference
        return False


@pytest.mark.parametrize("seed", range(CASES))
def test_mutated_safetensors_header(tmp_path, capsys, seed):
    rng = random.Random(seed)
    path = write_safetensors(tmp_path / f"fuzz{seed}.safetensors", _mutate_header(rng), b"\1" * 24)
    assert not _reference_accepts(path)
    _assert_refused(path, capsys)


@pytest.mark.parametrize("seed", range(12))
def test_empty_tensor_with_huge_dimensions_read_as_the_reference_reads_it(tmp_path, capsys, seed):
    """A shape holding 0 among dimensions of up to 2^62: where the product taken in order passes
    2^63-1 before the 0 ([2^62, 2^62, 0]) the reference refuses it and so must we, in one line;
    a 0 early enough ([0, 2^62, 2^62]) is a valid empty tensor, compared like any other."""
    rng = random.Random(seed)
    shape = [2 ** rng.randrange(32, 63), 2 ** rng.randrange(32, 63)]
    shape.insert(seed % 3, 0)
    path = write_safetensors(
        tmp_path / f"empty{seed}.safetensors", {"a": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}
    )
    if _reference_accepts(path):
        code, err = _compare(path, capsys)
        assert code == 0, err
    else:
        _assert_refused(path, capsys)


@pytest.mark.parametrize("seed", range(CASES))
def test_random_safetensors_bytes(tmp_path, capsys, seed):
    rng = random.Random(1000 + seed)
    save_file({"a": torch.randn(4, 4), "b": torch.arange(3)}, tmp_path / "ok.safetensors")
    data = bytearray((tmp_path / "ok.safetensors").read_bytes())
    kind = seed % 3
    if kind == 0:  # flip bytes in the length and the header
        header_end = 8 + struct.unpack("<Q", data[:8])[0]
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(0, header_end)] = rng.randrange(256)
    elif kind == 1:  # cut or extend the file
        data = data[: rng.randrange(len(data))] if rng.random() < 0.7 else data + b"\0" * rng.randint(1, 9)
    else:  # a length field claiming anything
        data[:8] = struct.pack("<Q", rng.choice([0, 1, 2**63, 100_000_001, len(data), rng.randrange(2**32)]))
    path = tmp_path / f"fuzz{seed}.safetensors"
    path.write_bytes(bytes(data))
    if _reference_accepts(path):  # a flip inside a name or a float: still a valid file
        code, err = _compare(path, capsys)
        assert code == 0 or (code == 2 and len(err) == 1), err
    else:
        _assert_refused(path, capsys)


# --- torch pickles ----------------------------------------------------------------------------


def _evil_opcodes(marker, protocol) -> bytes:
    return pickle.dumps({"w": RunsCode(marker)}, protocol=protocol)


@pytest.mark.parametrize("seed", range(CASES))
def test_mutated_torch_archive(tmp_path, capsys, seed):
    rng = random.Random(2000 + seed)
    marker = tmp_path / "pwned"
    torch.save({"w": torch.randn(3, 3), "n": torch.tensor(5)}, tmp_path / "ok.pt")
    kind = seed % 4
    if kind == 0:

        def transform(body):
            body = bytearray(body)
            for _ in range(rng.randint(1, 6)):
                body[rng.randrange(len(body))] = rng.randrange(256)
            return bytes(body)
    elif kind == 1:

        def transform(body):
            return body[: rng.randrange(1, len(body))]
    elif kind == 2:

        def transform(body):
            return _evil_opcodes(marker, rng.choice([2, 3, 4, 5]))
    else:

        def transform(body):
            return body

    records = {"data/0": os.urandom(rng.choice([0, 8, 35, 37]))} if kind == 3 else None
    path = rewrite_torch_zip(tmp_path / "ok.pt", tmp_path / f"fuzz{seed}.pt", pickle=transform, records=records)
    code, err = _compare(path, capsys)
    assert not marker.exists()
    # a flip can leave a valid pickle (a changed number): then it compares; otherwise one line
    assert code == 0 or (code == 2 and len(err) == 1 and path.name in err[0]), err


@pytest.mark.parametrize("seed", range(CASES))
def test_cut_or_spliced_legacy_pickle(tmp_path, capsys, seed):
    rng = random.Random(3000 + seed)
    marker = tmp_path / "pwned"
    torch.save({"w": torch.randn(3, 3)}, tmp_path / "ok.pt", _use_new_zipfile_serialization=False)
    data = (tmp_path / "ok.pt").read_bytes()
    if seed % 2:
        data = data[: rng.randrange(1, len(data) - 1)]
    else:
        cut = rng.randrange(2, len(data))
        data = data[:cut] + _evil_opcodes(marker, rng.choice([2, 4, 5])) + data[cut:]
    path = tmp_path / f"fuzz{seed}.bin"
    path.write_bytes(data)
    if seed % 2:
        _assert_refused(path, capsys, marker)
    else:  # spliced into the raw tensor bytes after the pickles, it is only different numbers
        code, err = _compare(path, capsys)
        assert not marker.exists()
        assert code == 0 or (code == 2 and len(err) == 1 and path.name in err[0]), err


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_bare_code_running_pickle_at_every_protocol(tmp_path, capsys, protocol):
    marker = tmp_path / "pwned"
    path = tmp_path / f"evil{protocol}.pt"
    path.write_bytes(_evil_opcodes(marker, protocol))
    _assert_refused(path, capsys, marker)


# --- shard indexes ----------------------------------------------------------------------------

_INDEX_VALUES = [
    3,
    1.5,
    None,
    True,
    [],
    {},
    "",
    "/etc/passwd",
    "../x.safetensors",
    "a/../../x.safetensors",
    "missing.safetensors",
    "C:\\x.safetensors",
    "\\\\server\\x.safetensors",
]


@pytest.mark.parametrize("seed", range(CASES))
def test_mutated_shard_index(tmp_path, capsys, seed):
    rng = random.Random(4000 + seed)
    folder = tmp_path / f"fuzz{seed}"
    folder.mkdir()
    save_file({"a": torch.ones(2)}, folder / "model-1.safetensors")
    kind = seed % 4
    if kind == 0:
        index = {"weight_map": {"a": rng.choice(_INDEX_VALUES)}}
    elif kind == 1:
        index = {"weight_map": rng.choice([3, "x", [], None, ["model-1.safetensors"]])}
    elif kind == 2:
        index = rng.choice([[], 3, "x", {"metadata": {}}, {"weight_map": {}}])
    else:
        depth = rng.choice([1000, 30_000])
        (folder / "model.safetensors.index.json").write_text('{"weight_map": ' + "[" * depth + "]" * depth + "}")
        index = None
    if index is not None:
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    _assert_refused(folder, capsys)


# --- state dicts: wrapper names and entries that are not tensors ---------------------------------

_WRAPPED = ["_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", ""]
_NOT_TENSORS = [None, {"format": 2}, "v2", 3, 1.5, [1, 2], b"\x00\x01"]


@pytest.mark.parametrize("seed", range(24))
def test_state_dicts_with_wrapper_names_and_extra_state(tmp_path, capsys, seed):
    """A Lightning-shaped ``.ckpt`` whose state dict mixes wrapper components (``_orig_mod.``) and
    entries that are not tensors (a module's ``_extra_state``): compared with itself, it is exit 0
    with every tensor measured and every other entry listed as skipped, unless two names become one
    without their wrappers: then exit 2, one line naming the file and both names."""
    rng = random.Random(5000 + seed)
    state, extra = {}, {}
    for layer in rng.sample(["a", "b", "c", "blk.a", "blk.b"], rng.randint(1, 4)):
        for copy in range(rng.choice([1, 1, 2])):  # a second copy under another wrapper collides
            state[rng.choice(_WRAPPED) + layer + ".weight"] = torch.full((2,), float(copy))
        if rng.random() < 0.5:
            extra[f"{layer}._extra_state"] = rng.choice(_NOT_TENSORS)
    path = tmp_path / f"fuzz{seed}.ckpt"
    torch.save({"state_dict": {**state, **extra}, "global_step": seed}, path)
    bare = [".".join(p for p in n.split(".") if not p.startswith("_") or p == "_extra_state") for n in state]
    out = tmp_path / "out.json"
    code = main(["compare", str(path), str(path), "--quiet", "--json", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    if len(set(bare)) < len(bare):
        assert code == 2 and len(err) == 1 and path.name in err[0] and "holds both" in err[0], err
        return
    assert code == 0, err
    result = json.loads(out.read_text())
    assert sorted(r["name"] for r in result["tensors"]) == sorted(bare)
    assert sorted(s["name"] for s in result["skipped"]) == sorted(list(extra) * 2)  # in A and in B
