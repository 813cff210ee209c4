"""``docs/method.md`` names every threshold by its constant: each constant its table names exists
where the table says, with the value the table states, and every constant the text names is in
the table."""

import ast
import importlib
import math
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "method.md"
ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]*)` \| `(divergence(?:\.\w+)+)` \| ([^|]+) \|", re.MULTILINE)


def table() -> dict[str, tuple[str, object]]:
    return {name: (module, ast.literal_eval(value.strip())) for name, module, value in ROW.findall(DOC.read_text())}


def same(a, b) -> bool:
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-12)


def test_every_constant_in_the_table_exists_with_the_stated_value():
    rows = table()
    assert len(rows) >= 20  # the table was read, not silently skipped
    wrong = {}
    for name, (module, stated) in rows.items():
        actual = getattr(importlib.import_module(module), name, "missing")
        if not same(actual, stated):
            wrong[name] = (stated, actual)
    assert wrong == {}, f"docs/method.md states (value, code has): {wrong}"


def test_every_constant_the_text_names_is_in_the_table():
    named = set(re.findall(r"`([A-Z][A-Z0-9_]{2,})`", DOC.read_text()))
    assert named - set(table()) == set()
