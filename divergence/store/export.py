"""The store flat: one row per (step, tensor), for pandas, spreadsheets and users' scripts.

Columns (a contract): ``step, tensor, module, kind``, then the metric names of
``divergence compare`` (``wasserstein, max_abs_diff, mean_abs_diff, rms_diff, rel_l2,
cosine, nonfinite_a, nonfinite_b``), then ``numel``.
"""

from __future__ import annotations

from pathlib import Path

from divergence.errors import UserInputError
from divergence.metrics.pair import METRIC_NAMES
from divergence.store.metrics_store import MetricsStore
from divergence.tables import write_csv

METRIC_COLUMNS = (*METRIC_NAMES, "nonfinite_a", "nonfinite_b")
COLUMNS = ("step", "tensor", "module", "kind", *METRIC_COLUMNS, "numel")


def export_csv(store: MetricsStore, path: str | Path) -> int:
    rows = list(store.tensor_records())
    write_csv(path, rows, COLUMNS)
    return len(rows)


def export_parquet(store: MetricsStore, path: str | Path) -> int:
    import pyarrow as pa  # divergence[parquet]: ``divergence export`` checks it is installed
    import pyarrow.parquet as pq

    rows = list(store.tensor_records())
    columns = {c: [r.get(c) for r in rows] for c in COLUMNS}
    schema = pa.schema(
        [("step", pa.int64()), ("tensor", pa.string()), ("module", pa.string()), ("kind", pa.string())]
        + [(c, pa.int64() if c.startswith("nonfinite") else pa.float64()) for c in METRIC_COLUMNS]
        + [("numel", pa.int64())]
    )
    try:
        pq.write_table(pa.table(columns, schema=schema), str(path))
    except OSError as err:
        raise UserInputError(f"{path}: cannot write: {err}") from None
    return len(rows)
