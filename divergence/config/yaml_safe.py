"""Reading recipe YAML as plain, bounded data: the one YAML loader of every recipe divergence reads.

``yaml.safe_load`` already refuses Python objects, but it still lets a few hundred bytes
denote an exponentially large document: an anchor (``&a [..]``) referenced by aliases
(``*a``) nine levels deep is a "billion laughs" bomb that loads in microseconds as a shared
graph and then hangs whatever walks or prints it. Recipes are short, hand-written mappings,
so this loader refuses what they never need, before anything walks the data:

- anchors, aliases and merge keys (``&a``, ``*a``, ``<<``): write the value out instead;
- files over ``MAX_BYTES`` and nesting deeper than ``MAX_DEPTH``
  (PyYAML's composer recurses, so deep nesting would otherwise be a RecursionError);
- mapping keys that are not strings (``1:``, ``yes:``), and duplicate keys (YAML keeps the
  last one silently; a recipe that says ``lr`` twice is a mistake);
- bytes that are not UTF-8.

Every refusal is one ``RecipeError`` naming the file and the line. ``short`` renders a user's
value for an error message in bounded length, so no message can echo a large value in full.
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

import yaml

from divergence.errors import RecipeError

# A recipe is a few KB; the shipped ones are under 4 KB.
MAX_BYTES = 1 << 20
# Recipes nest about five levels (pair -> recipe -> model -> unet -> list).
MAX_DEPTH = 32
# Longest rendering of a user's value inside an error message.
MAX_VALUE_CHARS = 80

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = MAX_VALUE_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 3


class _Refused(Exception):
    """What the loader refuses, with the line it found it on."""


class RecipeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without anchors, aliases, merge keys, deep nesting, odd or duplicate keys."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            mark = "*" if isinstance(event, yaml.AliasEvent) else "&"
            raise _Refused(
                f"line {line}: YAML anchors and aliases ({mark}{short(event.anchor, 30, text=True)}) are "
                "not allowed in recipes; write the value out in full"
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(
                    f"line {line}: nested more than {MAX_DEPTH} levels deep; a recipe is a few levels of "
                    "sections and lists"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _Refused(f"line {line}: merge keys (<<) are not allowed in recipes; write the keys out")
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise _Refused(
                    f'line {line}: key {short(key)} is not a name; recipe keys are strings (quote it: "yes", "1")'
                )
            if key in seen:
                raise _Refused(f"line {line}: duplicate key {short(key)}; give each key once")
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: Path) -> Any:
    """The plain data in the YAML file ``path``; RecipeError naming the file for anything refused."""
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise RecipeError(f"{path}: larger than {MAX_BYTES >> 10} KiB; a recipe is a short YAML mapping")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RecipeError(f"{path}: not UTF-8 text (byte {err.start}); save the recipe as UTF-8 YAML") from None
    try:
        return _load(text)
    except _Refused as err:
        raise RecipeError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise RecipeError(
            f"{path}: not valid YAML{where}: {short(getattr(err, 'problem', None) or err, text=True)}"
        ) from None
    except (ValueError, OverflowError, RecursionError) as err:  # e.g. an integer of 10,000 digits
        raise RecipeError(f"{path}: a value cannot be read: {short(err, text=True)}") from None


def read_yaml_value(text: str, where: str) -> Any:
    """A command-line override's value read as YAML; text that is not YAML stays a string."""
    if len(text) > MAX_BYTES:
        raise RecipeError(f"{where}: longer than {MAX_BYTES >> 10} KiB")
    try:
        return _load(text)
    except _Refused as err:
        raise RecipeError(f"{where}: {err}") from None
    except (yaml.YAMLError, ValueError, OverflowError, RecursionError):
        return text


def short(value: Any, limit: int = MAX_VALUE_CHARS, text: bool = False) -> str:
    """``value`` for an error message: its repr (or ``str`` with ``text``), at most ``limit`` characters;
    a longer one keeps its start and its end (a path's file name), joined by ``...``."""
    try:
        out = str(value) if text else _REPR.repr(value)
    except ValueError:  # an int beyond Python's 4300-digit str limit
        out = f"<{type(value).__name__}>"
    if len(out) <= limit:
        return out
    head = (limit - 3) // 2
    return out[:head] + "..." + out[len(out) - (limit - 3 - head) :]


def _load(text: str) -> Any:
    loader = RecipeLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
