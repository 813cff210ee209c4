"""Records out: aligned text tables for people, JSON and CSV files for scripts.

Non-finite floats are written as ``null`` in JSON (JSON has no NaN) and as ``nan``/``inf``
in CSV and tables; shapes are written ``320x4x3x3`` in CSV.
"""

from __future__ import annotations

import csv
import json
import math
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterable, Iterator, Sequence

from divergence.atomic import atomic_file
from divergence.errors import UserInputError


def format_value(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value == 0 or 1e-3 <= abs(value) < 1e5:
            return f"{value:.6g}"
        return f"{value:.3e}"
    if isinstance(value, (list, tuple)):
        return "x".join(map(str, value))
    return str(value)


def text_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """A right-aligned table (first column left-aligned) of ``columns`` from ``rows``."""
    cells = [[format_value(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]

    def line(values):
        first, *rest = values
        return "  ".join([first.ljust(widths[0])] + [v.rjust(w) for v, w in zip(rest, widths[1:])])

    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells])


def json_safe(value, nonfinite=lambda v: None):
    """NaN and infinities become ``nonfinite(v)`` (None; ``str``: "nan", "inf", "-inf"), recursively;
    tuples become lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return nonfinite(value)
    if isinstance(value, dict):
        return {k: json_safe(v, nonfinite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, nonfinite) for v in value]
    return value


def write_json(path: str | Path, payload: dict) -> None:
    """Write ``payload`` as JSON, atomically and durably (``divergence.atomic``)."""
    with _writing(path) as f:
        f.write(json.dumps(json_safe(payload), indent=1, allow_nan=False) + "\n")


def write_csv(path: str | Path, rows: Iterable[dict], columns: Sequence[str]) -> None:
    """Write ``rows`` flat with the given columns, atomically and durably."""
    with _writing(path, newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_csv_cell(row.get(c)) for c in columns])


def _csv_cell(value):
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return "x".join(map(str, value))
    if isinstance(value, float):
        return repr(value)  # shortest round-trip form: the exact float64 back on reading
    return value


@contextmanager
def _writing(path: str | Path, **open_args) -> Iterator[IO]:
    """``atomic_file(path, "w")``, its folder's absence or a failed write one ``UserInputError``."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise UserInputError(f"{path}: the folder {path.parent} does not exist")
    try:
        with atomic_file(path, "w", **open_args) as f:
            yield f
    except OSError as err:
        raise UserInputError(f"{path}: cannot write: {err.strerror or err}") from None
