"""``divergence export``: the flat (step, tensor) contract in CSV and Parquet."""

import csv
import math

import pytest

from divergence.cli import main
from divergence.store import MetricsStore

CONTRACT = [
    "step",
    "tensor",
    "module",
    "kind",
    "wasserstein",
    "max_abs_diff",
    "mean_abs_diff",
    "rms_diff",
    "rel_l2",
    "cosine",
    "nonfinite_a",
    "nonfinite_b",
]


@pytest.fixture
def store_dir(tmp_path):
    store = MetricsStore(tmp_path / "run").open_for_append()
    for step in (0, 10):
        records = [
            {
                "tensor": "unet.blk.to_q.weight",
                "module": "unet.blk.to_q",
                "kind": "attn_q",
                "numel": 4,
                "wasserstein": step * 0.1,
                "max_abs_diff": step * 0.2,
                "mean_abs_diff": 0.0,
                "rms_diff": 0.0,
                "rel_l2": math.inf if step else 0.0,
                "cosine": 1.0,
                "nonfinite_a": 0,
                "nonfinite_b": 0,
            }
        ]
        store.append_step(step, records, {"wasserstein": step * 0.1})
    return tmp_path / "run"


def test_csv_contract(store_dir, tmp_path, capsys):
    assert main(["export", str(store_dir), "--csv", str(tmp_path / "m.csv")]) == 0
    with open(tmp_path / "m.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[: len(CONTRACT)] == CONTRACT
    assert [(r["step"], r["tensor"]) for r in rows] == [("0", "unet.blk.to_q.weight"), ("10", "unet.blk.to_q.weight")]
    assert float(rows[1]["max_abs_diff"]) == 2.0 and float(rows[1]["rel_l2"]) == math.inf
    assert "wrote 2 rows" in capsys.readouterr().out


def test_parquet_contract(store_dir, tmp_path):
    import pyarrow.parquet as pq

    assert main(["export", str(store_dir), "--parquet", str(tmp_path / "m.parquet")]) == 0
    table = pq.read_table(tmp_path / "m.parquet")
    assert table.column_names[: len(CONTRACT)] == CONTRACT
    assert table.column("step").to_pylist() == [0, 10]


@pytest.mark.parametrize(
    "args,expected", [([], "nothing to write"), (["--csv", "/nonexistent/x.csv"], "does not exist")]
)
def test_bad_input(store_dir, capsys, args, expected):
    assert main(["export", str(store_dir), *args]) == 2
    assert expected in capsys.readouterr().err


def test_folder_without_store(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--csv", str(tmp_path / "x.csv")]) == 2
    assert "no metrics store here" in capsys.readouterr().err
