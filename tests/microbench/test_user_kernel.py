"""``--impl module:function``: a user's kernel beside the built-in ones, and its error paths."""

import csv
import importlib.util
import itertools
import math
from pathlib import Path

import pytest

from divergence.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

KERNEL = """
import torch

def attend(q, k, v, *, scale, causal):
    p = torch.softmax((q.float() @ k.float().transpose(-2, -1)) * scale, dim=-1)
    return (p @ v.float()).to(q.dtype)

def detached(q, k, v, *, scale, causal):
    return attend(q, k, v, scale=scale, causal=causal).detach()

def wrong_shape(q, k, v, *, scale, causal):
    return attend(q, k, v, scale=scale, causal=causal)[..., :-1]

def wrong_dtype(q, k, v, *, scale, causal):
    return attend(q, k, v, scale=scale, causal=causal).double()

def nan(q, k, v, *, scale, causal):
    return attend(q, k, v, scale=scale, causal=causal) * float("nan")

NOT_CALLABLE = 3
"""

_NAMES = itertools.count()
FAST = ["--quick", "--no-progress", "--precision", "bf16", "--seq-len", "32", "--block-size", "16"]


@pytest.fixture
def kernel_module(tmp_path, monkeypatch):
    """A module of user kernels, written to tmp_path and importable (a fresh name per test)."""
    name = f"user_kernels_{next(_NAMES)}"
    (tmp_path / f"{name}.py").write_text(KERNEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _rows(out: Path) -> list[dict]:
    with open(out / "results.csv") as f:
        return list(csv.DictReader(f))


def test_a_user_kernel_runs_beside_the_built_in_ones_forward_and_backward(kernel_module, tmp_path):
    spec = f"{kernel_module}:attend"
    out = tmp_path / "out"
    argv = [*FAST, "--impl", "baseline", "flash", spec, f"{kernel_module}:detached", "--input-dist", "ties"]
    assert main(["microbench", *argv, "--out", str(out)]) == 0
    rows = _rows(out)
    mine = [r for r in rows if r["impl"] == spec]
    assert {r["input_dist"] for r in mine} == {"normal:1", "ties:1:16"}  # the reference inputs and the scale study
    for r in mine:
        assert float(r["max_abs_err"]) > 0 and math.isfinite(float(r["bias_z"]))
        assert float(r["dq_max_abs_err"]) > 0 and math.isfinite(float(r["dv_bias_z"]))
        assert math.isfinite(float(r["delta_bias_z"]))
    detached = [r for r in rows if r["impl"] == f"{kernel_module}:detached"]
    assert detached and all(r["dq_bias_z"] == "" and r["delta_bias_z"] != "" for r in detached)  # no graph: no grads
    assert spec in (out / "summary.md").read_text()  # in the bias table and findings


@pytest.mark.parametrize(
    "attr,needle",
    [
        ("no_such_module:attend", "cannot import module 'no_such_module'"),
        ("MOD:missing", "has no attribute 'missing'"),
        ("MOD:NOT_CALLABLE", "'NOT_CALLABLE' is a int, not a callable"),
        ("MOD:wrong_shape", "returned shape (1, 2, 16, 15), expected (B, H, L, D) = (1, 2, 16, 16)"),
        ("MOD:wrong_dtype", "returned dtype fp64, expected the inputs' bf16"),
        ("MOD:nan", "512 of 512 output elements are not finite"),
    ],
)
def test_a_broken_user_kernel_exits_2_with_one_line(attr, needle, kernel_module, tmp_path, capsys):
    spec = attr.replace("MOD", kernel_module)
    assert main(["microbench", *FAST, "--impl", "baseline", spec, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("divergence microbench: error: --impl ")
    assert needle in err
    assert not (tmp_path / "out").exists()  # checked before anything is written


def test_the_example_kernel_runs_through_the_command(tmp_path):
    spec = importlib.util.spec_from_file_location("own_attention_kernel", EXAMPLES / "own_attention_kernel.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main([*FAST, "--out", str(tmp_path)]) == 0
    rows = [r for r in _rows(tmp_path) if r["impl"] == "own_attention_kernel:attention"]
    assert rows and all(float(r["max_abs_err"]) > 0 and r["dq_bias_z"] != "" for r in rows)
