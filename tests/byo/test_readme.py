"""The README's "Python API" examples run as written, and ``import divergence`` does nothing.

Every ```python block of the README's "Python API" section, then of docs/your-training.md's "From
Python" section (which the README links to), is executed in order, in one namespace, in a
temporary folder (they build a pair folder, its store and a report there).
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
YOUR_TRAINING = README.parent / "docs" / "your-training.md"


def python_blocks(section: str, page: Path = README) -> list[str]:
    text = page.read_text()
    start = text.index(f"## {section}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start : end if end > 0 else None], flags=re.S)


def test_python_api_examples_run(tmp_path, monkeypatch, capsys):
    readme = python_blocks("Python API")
    docs = python_blocks("From Python: a pair, its store and its report", YOUR_TRAINING)
    assert len(readme) >= 1 and len(docs) >= 1
    assert "docs/your-training.md#from-python-a-pair-its-store-and-its-report" in README.read_text()
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block, page in [*((b, README) for b in readme), *((b, YOUR_TRAINING) for b in docs)]:
        exec(compile(block, str(page), "exec"), namespace)
    assert (tmp_path / "report" / "report.html").is_file()
    assert namespace["pair"].steps.tolist() == list(range(21))  # densely tracked early: every step to 20
    assert namespace["result"].summary["max_abs_diff"] > 0
    assert namespace["pair"].model["max_abs_diff"][-1] > 0  # foreach vs fused AdamW
    printed = capsys.readouterr().out
    assert "report.html" in printed


def test_import_has_no_side_effects():
    """``import divergence`` loads no torch; importing the metrics makes no thread pool; the report's
    figures leave matplotlib's backend alone (before: a pool at import, ``matplotlib.use("Agg")``)."""
    code = (
        "import gc, sys, matplotlib; from concurrent.futures import ThreadPoolExecutor; matplotlib.use('pdf')\n"
        "import divergence; assert 'torch' not in sys.modules, 'torch imported'\n"
        "import divergence.metrics, divergence.report.build\n"
        "assert not any(isinstance(o, ThreadPoolExecutor) for o in gc.get_objects()), 'a pool made at import'\n"
        "assert matplotlib.get_backend() == 'pdf', matplotlib.get_backend()\n"
        "assert set(divergence.__all__) <= set(dir(divergence))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_compare_state_dicts_errors_speak_python():
    import torch

    import divergence

    a = {"w": torch.zeros(2), "only_a": torch.zeros(1)}
    with pytest.raises(divergence.CheckpointError, match=r"only_a.*intersection=True") as err:
        divergence.compare_state_dicts(a, {"w": torch.ones(2)})
    assert "--" not in str(err.value)
    partial = divergence.compare_state_dicts(a, {"w": torch.ones(2)}, intersection=True)
    assert partial.summary["max_abs_diff"] == 1.0 and partial.skipped == [{"name": "only_a", "reason": "only in A"}]
    mapped = divergence.compare_state_dicts(
        {"attn.q": torch.zeros(2)}, {"attn.to_q": torch.ones(2)}, maps={r"attn\.q$": "attn.to_q"}
    )
    assert [r["name"] for r in mapped.records] == ["attn.to_q"]
    with pytest.raises(divergence.UserInputError, match=r"maps: '\(' is not a valid regular expression"):
        divergence.compare_state_dicts(a, a, maps={"(": "x"})


def test_a_missing_name_says_where_divergence_was_imported_from():
    import divergence

    with pytest.raises(AttributeError) as err:
        divergence.ArmWritr  # noqa: B018 (a typo, or another folder named divergence)
    message = str(err.value)
    assert "has no attribute 'ArmWritr'" in message
    assert f"imported from {Path(divergence.__file__).parent}" in message and "shadowing" in message
    assert not hasattr(divergence, "__wrapped__")  # hasattr still works: an AttributeError


def test_the_bring_your_own_block_is_the_plain_loop_example():
    """The code block at the top of "Bring your own training" is the runnable example's, line for line."""
    example = (README.parent / "examples" / "plain_loop.py").read_text()
    text = README.read_text()
    start = text.index("## Bring your own training\n")
    block = text[start:].split("```python\n", 1)[1].split("```", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    code = [line for line in lines if line]
    assert len(code) >= 5 and "writer.record(step, model, loss)" in code
    assert [line for line in code if line not in example] == []
    assert text.index("```python", start) - start < 1200  # near the top of the section
