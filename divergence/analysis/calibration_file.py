"""What a ``calibration.json`` must hold for its readers, checked when it is read.

``divergence calibrate`` writes the file (``divergence.analysis.calibration.evaluate``); one
edited by hand, cut short or copied from elsewhere reaches ``report --calibration`` and the
atlas. ``check_calibration`` checks the type of every key the readers use (the equivalent dose,
the report's calibration paragraph, ``summary.json``), so a bad file is one line naming the file
and the key, never a traceback half-way through a report:

    recipe        {"id": str, ...}
    line          {"slope": number|null, "intercept": number|null, "anchor_eps": number > 0|null}
    anchor_curve  {"steps": [int, ...], "log10_rel_l2": [number, ...]}, of one length
    criteria      {name: {"pass": bool, ...}}; ``criteria.recovery.floor_eps`` number|null
    references    (may be absent) {name: {"log10_vs_anchor": number, ...}}

A number is a JSON number (not a boolean); keys beyond these are the calibration's own record
(doses, notes) and are not read. See docs/method.md ("Calibration").
"""

from __future__ import annotations

from pathlib import Path

from divergence.errors import UserInputError

REQUIRED = ("recipe", "line", "anchor_curve", "criteria")


def check_calibration(data, path: str | Path) -> dict:
    """``data`` (a parsed ``calibration.json``) if its readers can use it, else a ``UserInputError``
    naming ``path`` and the first key that is missing or of the wrong type."""
    if not isinstance(data, dict):
        _bad(path, "the file", f"holds {_kind(data)}, not a JSON object")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        _bad(path, missing[0], "is missing" + (f" (and {', '.join(missing[1:])})" if missing[1:] else ""))
    recipe = _object(path, data, "recipe")
    if not isinstance(recipe.get("id"), str):
        _bad(path, "recipe.id", f"is {_kind(recipe.get('id'))}, not a string")
    line = _object(path, data, "line")
    for key in ("slope", "intercept", "anchor_eps"):
        _number(path, line, key, "line", nullable=True)
    anchor = line.get("anchor_eps")
    if anchor is not None and not anchor > 0:
        _bad(path, "line.anchor_eps", f"is {anchor!r}, not a dose > 0")
    _check_curve(path, _object(path, data, "anchor_curve"))
    _check_criteria(path, _object(path, data, "criteria"))
    references = _object(path, data, "references") if data.get("references") is not None else {}
    for name in references:
        _number(path, _object(path, references, name, "references"), "log10_vs_anchor", f"references.{name}")
    return data


def _check_curve(path, curve: dict) -> None:
    steps, values = curve.get("steps"), curve.get("log10_rel_l2")
    if not isinstance(steps, list) or not all(type(s) is int for s in steps):
        _bad(path, "anchor_curve.steps", "must be a list of integer steps")
    if not isinstance(values, list) or not all(_is_number(v) for v in values):
        _bad(path, "anchor_curve.log10_rel_l2", "must be a list of numbers")
    if len(steps) != len(values):
        _bad(path, "anchor_curve", f"has {len(steps)} steps but {len(values)} values")


def _check_criteria(path, criteria: dict) -> None:
    for name in criteria:
        criterion = _object(path, criteria, name, "criteria")
        if not isinstance(criterion.get("pass"), bool):
            _bad(path, f"criteria.{name}.pass", f"is {_kind(criterion.get('pass'))}, not true or false")
    if "recovery" in criteria:
        _number(path, criteria["recovery"], "floor_eps", "criteria.recovery", nullable=True)


def _object(path, parent: dict, key: str, where: str = "") -> dict:
    value = parent[key]
    if not isinstance(value, dict):
        _bad(path, f"{where}.{key}" if where else key, f"is {_kind(value)}, not a JSON object")
    return value


def _number(path, parent: dict, key: str, where: str, nullable: bool = False) -> None:
    value = parent.get(key)
    if not (_is_number(value) or (nullable and value is None)):
        _bad(path, f"{where}.{key}", f"is {_kind(value)}, not a number" + (" or null" if nullable else ""))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value) -> str:
    if value is None:
        return "null (or missing)"
    kinds = {bool: "a boolean", str: "a string", list: "a list", dict: "an object", int: "a number", float: "a number"}
    return f"{kinds.get(type(value), type(value).__name__)} ({str(value)[:30]!r})"


def _bad(path, key: str, what: str):
    raise UserInputError(f"{path}: not a usable calibration.json: {key} {what}; write one with divergence calibrate")
