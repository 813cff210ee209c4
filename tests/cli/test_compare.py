"""``divergence compare`` end to end: output contract, thresholds, every bad-input path."""

import csv
import json
import os

import pytest
import torch
from safetensors.torch import save_file

from divergence.cli import main

RECORD_KEYS = {
    "name",
    "shape",
    "numel",
    "dtype_a",
    "dtype_b",
    "wasserstein",
    "max_abs_diff",
    "mean_abs_diff",
    "rms_diff",
    "rel_l2",
    "cosine",
    "nonfinite_a",
    "nonfinite_b",
}


@pytest.fixture
def pair(tmp_path):
    g = torch.Generator().manual_seed(0)
    a = {
        "blk.attn.to_q.weight": torch.randn(16, 16, generator=g),
        "blk.conv.weight": torch.randn(4, 2, 3, 3, generator=g),
        "blk.conv.bias": torch.randn(4, generator=g),
        "blk.norm.weight": torch.ones(4),
    }
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
        "shapes": (
            [str(tmp_path / "shape.safetensors")],
            "with different shapes (blk.attn.to_q.weight [16, 16] vs [3])",
        ),
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
    from divergence.metrics import METRIC_NAMES
    from divergence.store.export import METRIC_COLUMNS

    assert METRIC_CHOICES == METRIC_NAMES == METRIC_COLUMNS[: len(METRIC_NAMES)]
    assert METRIC_COLUMNS[len(METRIC_NAMES) :] == ("nonfinite_a", "nonfinite_b")


# --- numbers that were wrong with exit 0 -----------------------------------------------


def test_complex_tensors_are_compared_on_real_and_imaginary_parts(tmp_path, capsys):
    a = {"w": torch.tensor([1 + 1j, 2 + 2j, 3 - 1j], dtype=torch.complex64)}
    b = {"w": a["w"] + 0.5j}  # the real parts are equal: only the imaginary parts moved
    save_file(a, tmp_path / "a.safetensors")
    save_file(b, tmp_path / "b.safetensors")
    out = tmp_path / "o.json"
    args = ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--quiet", "--json", str(out)]
    assert main([*args, "--fail-above", "max_abs_diff=0.1"]) == 1
    record = json.loads(out.read_text())["tensors"][0]
    real_a, real_b = torch.view_as_real(a["w"]).double(), torch.view_as_real(b["w"]).double()
    assert record["max_abs_diff"] == 0.5 and record["numel"] == 6  # 3 values = 6 real numbers
    assert record["rel_l2"] == pytest.approx(((real_a - real_b).norm() / real_a.norm()).item(), rel=1e-12)
    assert record["dtype_a"] == "complex64"


def _with_buffer(tmp_path, counter_a, counter_b):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 8, generator=g)
    save_file({"bn.weight": w, "bn.num_batches_tracked": torch.tensor(counter_a)}, tmp_path / "a.safetensors")
    save_file({"bn.weight": w + 1e-3, "bn.num_batches_tracked": torch.tensor(counter_b)}, tmp_path / "b.safetensors")
    return str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")


def test_integer_buffers_are_reported_apart_from_the_model_numbers(tmp_path, capsys):
    pa, pb = _with_buffer(tmp_path, 0, 1000)
    assert (
        main(["compare", pa, pb, "--quiet", "--json", str(tmp_path / "o.json"), "--fail-above", "max_abs_diff=0.01"])
        == 0
    )
    out = capsys.readouterr().out
    assert "1 integer/bool buffers" in out and "left out: 1 integer/bool buffers" in out
    payload = json.loads((tmp_path / "o.json").read_text())
    summary = payload["summary"]
    assert summary["max_abs_diff"] == pytest.approx(1e-3, rel=1e-3) and summary["buffers"] == 1
    assert summary["tensors"] == 1 and not summary["buffers_included"]
    buffer = next(r for r in payload["tensors"] if r["name"] == "bn.num_batches_tracked")
    assert buffer["max_abs_diff"] == 1000 and buffer["dtype_a"] == "int64"  # still measured, and in the records
    assert main(["compare", pa, pb, "--quiet", "--json", str(tmp_path / "o.json"), "--include-buffers"]) == 0
    assert json.loads((tmp_path / "o.json").read_text())["summary"]["max_abs_diff"] == 1000


def test_exclude_is_a_regular_expression_and_repeatable(pair, tmp_path, capsys):
    pa, pb, *_ = pair
    out = tmp_path / "o.json"
    args = ["compare", str(pa), str(pb), "--quiet", "--json", str(out)]
    assert main([*args, "--exclude", r"conv\.w", "--exclude", "^blk.norm"]) == 0
    payload = json.loads(out.read_text())
    assert sorted(r["name"] for r in payload["tensors"]) == ["blk.attn.to_q.weight", "blk.conv.bias"]
    assert {s["name"]: s["reason"] for s in payload["skipped"]} == {
        "blk.conv.weight": r"excluded by --exclude conv\.w",
        "blk.norm.weight": "excluded by --exclude ^blk.norm",
    }
    assert "skipped 2 tensors" in capsys.readouterr().out
    assert main([*args, "--exclude", "("]) == 2
    assert "--exclude '(': not a valid regular expression" in _error_line(capsys)
    assert main([*args, "--exclude", "blk"]) == 2
    assert "--exclude leaves no tensor to compare" in _error_line(capsys)


def test_exclude_lets_a_one_sided_tensor_through(pair, tmp_path):
    pa, _, a, _ = pair
    save_file(dict(a, **{"ema.weight": torch.ones(3)}), tmp_path / "ema.safetensors")
    assert main(["compare", str(pa), str(tmp_path / "ema.safetensors"), "--quiet", "--exclude", "^ema"]) == 0


def test_mostly_nan_tensor_fails_fail_above_unless_allowed(pair, tmp_path, capsys):
    pa, _, a, _ = pair
    bad = dict(a)
    bad["blk.attn.to_q.weight"] = torch.full((16, 16), float("nan"))
    bad["blk.attn.to_q.weight"][0, :3] = 1.0
    save_file(bad, tmp_path / "nan.safetensors")
    args = ["compare", str(pa), str(tmp_path / "nan.safetensors"), "--quiet", "--fail-above", "max_abs_diff=1e9"]
    assert main(args) == 1
    assert "1 tensors hold NaN/inf (blk.attn.to_q.weight)" in capsys.readouterr().err
    assert main([*args, "--allow-nonfinite"]) == 0


# --- output paths are checked first, temporary files never left behind ----------------


@pytest.mark.parametrize(
    "flag,value,expected",
    [
        ("--json", "", "--json '': an empty path"),
        ("--csv", "/nonexistent/dir/o.csv", "the folder /nonexistent/dir does not exist"),
        ("--json", "DIR", "is a folder"),
        ("--csv", "A", "is one of the checkpoints being compared"),
    ],
)
def test_bad_output_path_is_refused_before_reading_a_checkpoint(tmp_path, capsys, flag, value, expected):
    (tmp_path / "garbage.safetensors").write_bytes(b"\x07" * 3)  # reading it would be a different error
    value = {"DIR": str(tmp_path), "A": str(tmp_path / "garbage.safetensors")}.get(value, value)
    assert (
        main(
            [
                "compare",
                str(tmp_path / "garbage.safetensors"),
                str(tmp_path / "garbage.safetensors"),
                "--quiet",
                flag,
                value,
            ]
        )
        == 2
    )
    assert expected in _error_line(capsys)
    assert not list(tmp_path.glob(".*tmp*")) and not list(tmp_path.glob(".*probe*"))


def test_read_only_folder_is_refused_before_the_comparison(pair, tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    pa, pb, *_ = pair
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert main(["compare", str(pa), str(pb), "--quiet", "--csv", str(locked / "o.csv")]) == 2
        assert "cannot write in" in _error_line(capsys)
    finally:
        locked.chmod(0o700)


def test_outputs_written_leave_no_temporary_files(pair, tmp_path):
    pa, pb, *_ = pair
    assert (
        main(
            [
                "compare",
                str(pa),
                str(pb),
                "--quiet",
                "--json",
                str(tmp_path / "o.json"),
                "--csv",
                str(tmp_path / "o.csv"),
            ]
        )
        == 0
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors", "b.safetensors", "o.csv", "o.json"]


# --- hostile checkpoints through the command line ----------------------------------------


def test_float8_checkpoints_compare(tmp_path, capsys):
    a = torch.tensor([0.5, -2.0, 448.0]).to(torch.float8_e4m3fn)
    b = torch.tensor([0.5, -2.0, 416.0]).to(torch.float8_e4m3fn)
    save_file({"w": a}, tmp_path / "a.safetensors")
    torch.save({"w": b}, tmp_path / "b.pt")
    assert (
        main(
            [
                "compare",
                str(tmp_path / "a.safetensors"),
                str(tmp_path / "b.pt"),
                "--quiet",
                "--json",
                str(tmp_path / "o.json"),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "o.json").read_text())["tensors"][0]["max_abs_diff"] == 32.0


def test_short_storage_in_pt_is_exit_2_not_garbage(tmp_path, capsys):
    from tests.checkpoints.forge import rewrite_torch_zip

    torch.save({"w": torch.arange(1000, dtype=torch.float32), "v": torch.ones(3000)}, tmp_path / "ok.pt")
    rewrite_torch_zip(tmp_path / "ok.pt", tmp_path / "short.pt", records={"data/0": b"\0" * 100})
    assert main(["compare", str(tmp_path / "ok.pt"), str(tmp_path / "short.pt"), "--quiet"]) == 2
    assert "short.pt: corrupt or truncated torch checkpoint" in _error_line(capsys)


def test_every_safetensors_dtype_compares(tmp_path):
    a = {
        "f64": torch.tensor([1.0, 2.0], dtype=torch.float64),
        "bf16": torch.tensor([1.0, 2.0]).bfloat16(),
        "f8": torch.tensor([1.0, 2.0]).to(torch.float8_e5m2),
        "c64": torch.tensor([1 + 1j, 2j]),
        "u16": torch.tensor([1, 2], dtype=torch.uint16),
        "u32": torch.tensor([1, 2], dtype=torch.uint32),
        "u64": torch.tensor([1, 2], dtype=torch.uint64),
        "i8": torch.tensor([1, -2], dtype=torch.int8),
        "mask": torch.tensor([True, False]),
    }
    b = {k: (v.double() + 1).to(v.dtype) if not v.is_complex() and v.dtype != torch.bool else v for k, v in a.items()}
    save_file(a, tmp_path / "a.safetensors")
    save_file(b, tmp_path / "b.safetensors")
    out = tmp_path / "o.json"
    assert (
        main(
            ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--quiet", "--json", str(out)]
        )
        == 0
    )
    payload = json.loads(out.read_text())
    diffs = {r["name"]: r["max_abs_diff"] for r in payload["tensors"]}
    assert diffs == {"f64": 1, "bf16": 1, "f8": 1, "c64": 0, "u16": 1, "u32": 1, "u64": 1, "i8": 1, "mask": 0}
    assert payload["summary"]["buffers"] == 5 and payload["summary"]["tensors"] == 4


def test_complex_against_real_is_one_line(tmp_path, capsys):
    save_file({"w": torch.ones(2, dtype=torch.complex64)}, tmp_path / "a.safetensors")
    save_file({"w": torch.ones(2)}, tmp_path / "b.safetensors")
    assert main(["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--quiet"]) == 2
    assert "tensor 'w' is complex64 in" in _error_line(capsys)


def test_an_empty_tensor_does_not_fail_identical_files(tmp_path, capsys):
    """The issue's case: a 0-element tensor counted as NaN/inf, so --fail-above exited 1 on two
    identical files."""
    tensors = {"w": torch.arange(6.0).reshape(2, 3), "empty": torch.zeros(0, 3)}
    for name in ("a", "b"):
        save_file(tensors, str(tmp_path / f"{name}.safetensors"))
    args = ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]
    assert main([*args, "--fail-above", "max_abs_diff=0", "--json", str(tmp_path / "o.json")]) == 0
    summary = json.loads((tmp_path / "o.json").read_text())["summary"]
    assert summary["tensors_nonfinite"] == 0 and summary["max_abs_diff"] == 0.0
    assert "NaN/inf" not in capsys.readouterr().out
