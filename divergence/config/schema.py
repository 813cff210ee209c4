"""Recipes choose, the package defines: YAML sections parsed into small frozen dataclasses.

A recipe is plain YAML: names of registered components and numbers, never class paths.
Each section is a frozen dataclass whose fields carry a docstring-style comment and whose
``__post_init__`` rejects impossible values. ``parse`` walks the YAML mapping against the
dataclass, so an unknown key, a wrong type or an impossible value is one ``RecipeError``
that names the dotted key (``train.lr``) before any work starts.

Command-line overrides are ``dotted.key=value`` strings, the value read as YAML
(``train.lr=1e-4``, ``model.channels=[32,64]``, ``data.caption=null``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from divergence.errors import RecipeError
from divergence.config.yaml_safe import read_yaml, read_yaml_value, short

T = TypeVar("T")
# Integers of a recipe fit in 64 bits (torch seeds, sizes and step counts are int64).
INT_LIMIT = 1 << 63
# Longest validation message (they may quote a user's list).
MAX_MESSAGE_CHARS = 400


def load_yaml(path: str | Path) -> dict:
    """Read a recipe: a YAML mapping, loaded by ``divergence.config.yaml_safe`` (plain data only:
    no Python objects, no anchors or aliases, bounded size and depth, string keys, no duplicates)."""
    path = Path(path)
    try:
        if not path.is_file():
            raise RecipeError(f"{path}: recipe file not found")
        data = read_yaml(path)
    except OSError as err:
        raise RecipeError(f"{path}: cannot read the recipe ({err.strerror or err})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping, got {type(data).__name__}")
    return data


def parse(cls: type[T], data: Any, where: str = "") -> T:
    """Build dataclass ``cls`` from mapping ``data``; ``where`` is the dotted path for errors."""
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(f"{where or 'recipe'}: expected a mapping, got {_describe(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(map(str, set(data) - set(fields)))
    if unknown:
        raise RecipeError(
            f"unknown key {short(_join(where, unknown[0]))}; allowed keys in "
            f"{where or 'the recipe'}: {', '.join(sorted(fields))}"
        )
    hints = get_type_hints(cls)
    values = {name: _coerce(hints[name], value, _join(where, name)) for name, value in data.items()}
    missing = [
        n
        for n, f in fields.items()
        if n not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise RecipeError(f"missing required key {_join(where, missing[0])!r}")
    try:
        return cls(**values)
    except RecipeError as err:
        raise RecipeError(_qualify(str(err), where, fields)) from None
    except (TypeError, ValueError) as err:
        raise RecipeError(f"{where or 'recipe'}: {err}") from None


def _qualify(message: str, where: str, fields) -> str:
    """``every: must be >= 1`` raised inside section ``tracking`` -> ``tracking.every: ...``."""
    if not where or message.startswith(where):
        return message
    head = message.split(":", 1)[0]
    if head.split(".")[0].split("[")[0] in fields:
        return f"{where}.{message}"
    return f"{where}: {message}"


def _coerce(hint: Any, value: Any, key: str) -> Any:
    origin = get_origin(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, key)
            except RecipeError as err:
                errors.append(str(err))
        raise RecipeError(errors[0] if len(errors) == 1 else f"{key}: {_describe(value)} fits none of {hint}")
    if origin is Literal:
        allowed = get_args(hint)
        if value not in allowed:
            raise RecipeError(f"{key}: {short(value)} is not one of {', '.join(map(repr, allowed))}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise RecipeError(f"{key}: expected a list, got {_describe(value)}")
        args = get_args(hint)
        item = args[0] if args else Any
        return tuple(_coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise RecipeError(f"{key}: expected a mapping, got {_describe(value)}")
        _, vt = get_args(hint) or (str, Any)
        return {str(k): _coerce(vt, v, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        return parse(hint, value, key)
    if hint is bool:
        if not isinstance(value, bool):
            raise RecipeError(f"{key}: expected true or false, got {_describe(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecipeError(f"{key}: expected an integer, got {_describe(value)}")
        if not -INT_LIMIT <= value < INT_LIMIT:
            raise RecipeError(f"{key}: {short(value)} does not fit in a 64-bit integer")
        return value
    if hint is float:
        if isinstance(value, str):
            value = _float_string(value)  # YAML 1.1 reads 1e-4 (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecipeError(f"{key}: expected a number, got {_describe(value)}")
        number = float(value) if abs(value) < 1e300 else math.inf  # a 400-digit int would overflow
        if not math.isfinite(number):
            raise RecipeError(
                f"{key}: {short(value)} is not a finite number (1e999 reads as infinity); give a finite value"
            )
        return number
    if hint is str:
        if not isinstance(value, str):
            raise RecipeError(f"{key}: expected a string, got {_describe(value)}")
        return value
    raise TypeError(f"recipe schema cannot parse type {hint!r} at {key}")  # a bug in the schema


def apply_overrides(data: dict, overrides: typing.Iterable[str]) -> dict:
    """Return a copy of ``data`` with ``dotted.key=value`` overrides applied (value as YAML)."""
    data = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise RecipeError(f"override {short(item)}: expected KEY=VALUE, for example train.lr=1e-4")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise RecipeError(f"override {short(item)}: the key is empty")
        parts = key.split(".")
        if not all(parts):  # `.train.lr`, `train..lr`, `train.`: no key of any recipe
            raise RecipeError(f"override {short(item)}: the key has an empty part; write dotted names, e.g. train.lr")
        value = read_yaml_value(raw, f"override {short(key)}")
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise RecipeError(f"override {short(item)}: {short(part)} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def to_dict(obj: Any) -> Any:
    """The resolved recipe as plain YAML-able data (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def require(condition: bool, key: str, message: str) -> None:
    """Validation helper for ``__post_init__``: raise a RecipeError naming ``key``."""
    if not condition:
        raise RecipeError(f"{key}: {short(message, MAX_MESSAGE_CHARS, text=True)}")


def _float_string(text: str):
    """``"1e-4"`` -> 1e-4; any other string is returned unchanged (and then rejected)."""
    try:
        return float(text) if text.strip().lower() not in ("nan", "inf", "-inf", "infinity") else text
    except ValueError:
        return text


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {short(value)}" if value is not None else "null"
