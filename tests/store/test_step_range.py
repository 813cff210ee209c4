"""A step past int64 in a store is refused where the store is read, naming the file and line
(``report`` and ``export --parquet`` used to crash later, in numpy and pyarrow)."""

import json

import pytest

from divergence.cli import main
from divergence.store import MetricsStore
from tests.analysis.synthetic import write_pair


def _with_step(folder, step: int, kind: str) -> int:
    """Append one complete record of ``kind`` at ``step`` to the store; its line number."""
    path = folder / "metrics.jsonl"
    lines = path.read_text().splitlines()
    last = next(json.loads(line) for line in reversed(lines) if json.loads(line)["type"] == kind)
    path.write_text("\n".join([*lines, json.dumps(last | {"step": step})]) + "\n")
    return len(lines) + 1


@pytest.mark.parametrize("kind", ["step", "tensor"])
@pytest.mark.parametrize("command", ["report", "export"])
def test_a_step_past_int64_is_one_line_naming_the_file_and_line(command, kind, tmp_path, capsys):
    run = write_pair(tmp_path / "run", "p", "optimization", 1e-4)
    line = _with_step(run, 2**63, kind)
    args = (
        ["report", str(run), "--out", str(tmp_path / "report"), "--no-wandb"]
        if command == "report"
        else ["export", str(run), "--parquet", str(tmp_path / "m.parquet")]
    )
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run / 'metrics.jsonl'}: line {line}: " in err and "64-bit" in err, err
    assert not (tmp_path / "m.parquet").exists()


def test_the_largest_int64_step_is_read(tmp_path):
    run = write_pair(tmp_path / "run", "p", "optimization", 1e-4)
    _with_step(run, 2**63 - 1, "step")
    assert MetricsStore(run).step_records()[-1]["step"] == 2**63 - 1
