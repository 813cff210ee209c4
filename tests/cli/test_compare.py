"""``divergence compare`` end to end: output contract, thresholds, every bad-input path."""

import csv
import json
import os

import pytest
import torch
from safetensors.torch import save_file

from divergence.cli import main

RECORD_KEYS = {"name", "shape", "numel", "dtype_a", "dtype_b", "wasserstein", "max_abs_diff", "mean_abs_diff",
               "rms_diff", "rel_l2", "cosine", "nonfinite_a", "nonfinite_b"}


@pytest.fixture
def pair(tmp_path):
    g = torch.Generator().manual_seed(0)
    a = {"blk.attn.to_q.weight": torch.randn(16, 16, generator=g), "blk.conv.weight": torch.randn(4, 2, 3, 3, generator=g),
         "blk.conv.bias": torch.randn(4, generator=g), "blk.norm.weight": torch.ones(4)}
    b = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in a.items()}
    b["blk.conv.weight"] = b["blk.conv.weight"] * 3  # the most divergent tensor
    save_file(a, tmp_path / "a.safetensors")
    save_file(b, tmp_path / "b.safetensors")
    return tmp_path / "a.safetensors", tmp_path / "b.safetensors", a, b


def test_json_and_csv_contract(pair, tmp_path, capsys):
    pa, pb, a, b = pair
    code = main(["compare", str(pa), str(pb), "--json", str(tmp_path / "o.json"), "--csv", str(tmp_path / "o.csv")])
    assert code == 0
    out = capsys.readouterr().out
    table_rows = [line.split()[0] for line in out.splitlines()[3:7]]
    assert table_rows[0] == "blk.conv.weight"  # largest wasserstein first
    payload = json.loads((tmp_path / "o.json").read_text())
    assert set(payload) >= {"tensors", "summary"}
    assert len(payload["tensors"]) == 4
    for record in payload["tensors"]:
        assert RECORD_KEYS <= set(record)
    record = next(r for r in payload["tensors"] if r["name"] == "blk.conv.weight")
    expected = (a["blk.conv.weight"].double() - b["blk.conv.weight"].double()).abs().max().item()
    assert record["max_abs_diff"] == expected and record["shape"] == [4, 2, 3, 3] and record["kind"] == "conv"
    assert payload["summary"]["max_abs_diff"] == max(r["max_abs_diff"] for r in payload["tensors"])
    with open(tmp_path / "o.csv") as f:
        rows = list(csv.DictReader(f))
    assert RECORD_KEYS <= set(rows[0]) and len(rows) == 4
    assert float(next(r for r in rows if r["name"] == "blk.conv.weight")["max_abs_diff"]) == expected


@pytest.mark.parametrize("group,first", [("module", "blk.conv"), ("kind", "conv"), ("model", "model")])
def test_group_rows(pair, capsys, group, first):
    pa, pb, *_ = pair
    assert main(["compare", str(pa), str(pb), "--group", group, "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[3].split()[0] == first


def test_fail_above(pair, capsys):
    pa, pb, *_ = pair
    assert main(["compare", str(pa), str(pb), "--fail-above", "max_abs_diff=1e9"]) == 0
    assert main(["compare", str(pa), str(pb), "--fail-above", "max_abs_diff=1e-6"]) == 1
    assert "threshold exceeded: max_abs_diff" in capsys.readouterr().err


def test_identical_checkpoints_are_zero(pair, tmp_path):
    pa, *_ = pair
    assert main(["compare", str(pa), str(pa), "--json", str(tmp_path / "o.json"), "--fail-above", "wasserstein=0"]) == 0
    summary = json.loads((tmp_path / "o.json").read_text())["summary"]
    assert summary["wasserstein"] == 0 and summary["max_abs_diff"] == 0 and summary["cosine"] == 1


def test_nonfinite_is_reported_not_fatal(pair, tmp_path, capsys):
    pa, _, a, _ = pair
    bad = dict(a)
    bad["blk.norm.weight"] = torch.tensor([1.0, float("nan"), float("inf"), 1.0])
    save_file(bad, tmp_path / "nan.safetensors")
    assert main(["compare", str(pa), str(tmp_path / "nan.safetensors"), "--json", str(tmp_path / "o.json")]) == 0
    assert "hold NaN/inf" in capsys.readouterr().out
    payload = json.loads((tmp_path / "o.json").read_text())
    record = next(r for r in payload["tensors"] if r["name"] == "blk.norm.weight")
    assert record["nonfinite_b"] == 2 and record["wasserstein"] is None
    assert payload["summary"]["tensors_nonfinite"] == 1 and payload["summary"]["max_abs_diff"] == 0


def _error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


def _bad_inputs(tmp_path, pa):
    (tmp_path / "garbage.safetensors").write_bytes(b"\x07" * 3)
    (tmp_path / "weird.npz").write_bytes(b"x")
    save_file({"other.weight": torch.zeros(2)}, tmp_path / "other.safetensors")
    save_file({"blk.attn.to_q.weight": torch.zeros(3)}, tmp_path / "shape.safetensors")
    data = pa.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) - 100])
    return {
        "missing": ([str(tmp_path / "absent.safetensors")], "absent.safetensors: no such file"),
        "corrupt": ([str(tmp_path / "garbage.safetensors")], "garbage.safetensors: not a safetensors file"),
        "truncated": ([str(tmp_path / "cut.safetensors")], "cut.safetensors: truncated"),
        "format": ([str(tmp_path / "weird.npz")], "unknown checkpoint format"),
        "mismatch": ([str(tmp_path / "other.safetensors")], "do not match: 4 only in"),
        "disjoint": ([str(tmp_path / "other.safetensors"), "--intersection"], "no tensor names in common"),
        "shapes": ([str(tmp_path / "shape.safetensors")], "with different shapes (blk.attn.to_q.weight [16, 16] vs [3])"),
    }


@pytest.mark.parametrize("case", ["missing", "corrupt", "truncated", "format", "mismatch", "disjoint", "shapes"])
def test_bad_checkpoints_exit_2_with_one_line(pair, tmp_path, capsys, case):
    pa, *_ = pair
    args, expected = _bad_inputs(tmp_path, pa)[case]
    assert main(["compare", str(pa), *args]) == 2
    line = _error_line(capsys)
    assert line.startswith("divergence compare: error:") and expected in line


@pytest.mark.parametrize(
    "options,expected",
    [
        (["--fail-above", "bogus=1"], "metric must be one of"),
        (["--fail-above", "max_abs_diff=abc"], "is not a number"),
        (["--top", "-1"], "--top -1"),
        (["--group", "layer"], "invalid choice"),
        (["--map", "nope"], "expected PATTERN=REPLACEMENT"),
        (["--device", "tpu:0"], "not a device name"),
        (["--json", "/nonexistent/dir/o.json"], "does not exist"),
    ],
)
def test_bad_options_exit_2_with_one_line(pair, capsys, options, expected):
    pa, pb, *_ = pair
    with pytest.raises(SystemExit) if options[0] == "--group" else _nothing():
        code = main(["compare", str(pa), str(pb), "--quiet", *options])
        assert code == 2
    assert expected in _error_line(capsys)


def test_code_running_pickle_via_cli(pair, tmp_path, capsys):
    pa, *_ = pair

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "pwned"),))

    torch.save({"w": Payload()}, tmp_path / "evil.pt")
    assert main(["compare", str(pa), str(tmp_path / "evil.pt")]) == 2
    assert "refused to unpickle" in _error_line(capsys)
    assert not (tmp_path / "pwned").exists()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_metric_names_are_one_contract():
    """compare's columns, the store export's columns and the metrics package agree."""
    from divergence.cli.compare import METRIC_CHOICES
    from divergence.metrics import METRICS
    from divergence.store.export import METRIC_COLUMNS

    assert METRIC_CHOICES == METRICS == METRIC_COLUMNS[: len(METRICS)]
    assert METRIC_COLUMNS[len(METRICS):] == ("nonfinite_a", "nonfinite_b")
