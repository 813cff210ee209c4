"""The examples run as a user runs them, with a small step count, and leave a complete pair folder."""

import importlib.util
import json
import re
from pathlib import Path

from divergence.store import MetricsStore

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str):
    """``examples/<name>.py`` as a module (its ``main`` is what ``python examples/<name>.py`` runs)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def test_own_lightning_module_in_lockstep(tmp_path):
    example = _load("own_lightning_module")
    example.main(["--out", str(tmp_path), "--steps", "3", "--every", "2"])
    store = MetricsStore(tmp_path)
    assert store.steps() == [0, 1, 2, 3]
    records = store.step_records()
    assert records[0]["max_abs_diff"] == 0.0  # the same initial weights
    assert records[-1]["max_abs_diff"] > 0  # flash vs baseline attention: the weights move apart
    assert "attn_q" in records[-1]["kinds"]
    assert json.loads((tmp_path / "pair.json").read_text())["arms"]["a"] == ["attention=sdpa-flash"]


def test_plain_loop_as_two_processes_and_watch(tmp_path):
    """The example's ``main`` here (its two arm processes are its own ``Popen``s, its watch runs in
    this process): a process of its own would import torch and the comparator again (~7 s of CPU)."""
    example = _load("plain_loop")
    assert example.main(["--out", str(tmp_path), "--steps", "6", "--every", "3"]) == 0
    store = MetricsStore(tmp_path)
    assert store.steps() == list(range(7))
    assert [r["step"] for r in store.step_records() if r["tracked"]] == list(range(7))  # dense early schedule
    assert store.step_records()[-1]["max_abs_diff"] > 0  # foreach vs fused AdamW differ in the last bits
    assert (tmp_path / "csv" / "metrics.csv").is_file()  # watch's logs


def test_plain_pair_in_one_loop_then_the_report(tmp_path, capsys):
    """Two in-process pairs of a plain loop (``divergence.Pair``) and ``divergence.build_report`` over both."""
    report = _load("plain_pair").main(["--out", str(tmp_path), "--steps", "4", "--every", "2"])
    for name in ("adamw-fused-vs-foreach", "bf16-vs-fp32"):
        assert MetricsStore(tmp_path / name).steps() == [0, 1, 2, 3, 4]
        assert json.loads((tmp_path / name / "pair.json").read_text())["finished"] is True
    fused, bf16 = (
        MetricsStore(tmp_path / n).step_records()[-1]["max_abs_diff"]
        for n in ("adamw-fused-vs-foreach", "bf16-vs-fp32")
    )
    assert 0 < fused < bf16  # fused vs foreach AdamW: the last bits; bf16 autocast: far more
    assert report.summary["pairs"]["bf16-vs-fp32"]["category"] == "precision"
    assert (tmp_path / "report" / "report.html").is_file()
    assert "2 pairs; the report: " in capsys.readouterr().out


def test_examples_use_the_public_api_and_their_own_data():
    """Examples import only divergence's documented modules (no built-in trainer's data) and watch a
    pair with ``divergence.watch``, not the command through ``divergence.cli.main``."""
    public = {"divergence", "divergence.lightning", "divergence.writers", "divergence.errors", "divergence.cli"}
    for path in EXAMPLES.glob("*.py"):
        text = path.read_text()
        imported = set(re.findall(r"^\s*(?:from|import) (divergence[\w.]*)", text, re.MULTILINE))
        assert imported <= public, (path.name, imported - public)
        assert '["watch"' not in text, path.name


def test_one_step_check_example():
    """Two ranks read reordering-like, the parameter left out of the all-reduce beyond reordering."""
    results = _load("one_step_check").main()
    assert results["two_ranks"].status == "reordering_like"
    assert results["two_ranks_one_left_out"].status == "beyond_reordering"
    assert results["two_ranks_one_left_out"].worst(1)[0][0] == "2.bias"
