"""Naming the globals a pickle references, without unpickling it.

``torch.load(weights_only=True)`` refuses a pickle that references anything outside its
allow-list, but for pickle protocols 4 and 5 it stops at the first ``FRAME`` opcode and
never says which global the file wanted. ``referenced_globals`` walks the opcodes with
``pickletools.genops`` (a disassembler: it builds no object and calls nothing) and returns
``module.name`` for every ``GLOBAL``, ``INST`` and ``STACK_GLOBAL``; for ``STACK_GLOBAL``
the two operands are the last two strings pushed or fetched from the memo, which is how
every Python pickler writes them. A name it cannot work out is reported as ``?``.
"""

from __future__ import annotations

import io
import pickletools

_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
_MAX_OPS = 10_000_000  # a bound on work for a hostile file; real data.pkl files have a few thousand


def referenced_globals(data: bytes) -> list[str]:
    """``module.name`` of every global the pickle(s) in ``data`` reference, in order of first use.

    ``data`` may hold several pickles back to back (torch's legacy format does); scanning
    stops quietly at the first byte that is not a valid opcode.
    """
    found: list[str] = []
    stream = io.BytesIO(data)
    while stream.tell() < len(data):
        start = stream.tell()
        _scan_one(stream, found)
        if stream.tell() == start:
            break
    return list(dict.fromkeys(found))


def unsafe_globals(data: bytes, allowed=()) -> list[str]:
    """Globals the pickle(s) in ``data`` reference outside torch's weights-only allow-list and ``allowed``."""
    from torch import _weights_only_unpickler as weights_only

    safe = set(weights_only._get_allowed_globals()) | {f"{g.__module__}.{g.__name__}" for g in allowed}
    return [g for g in referenced_globals(data) if g not in safe]


def _scan_one(stream: io.BytesIO, found: list[str]) -> None:
    strings: list[str] = []
    memo: dict[int, str | None] = {}
    top = None  # the string on top of the stack, if the last opcode pushed one
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(stream)):
            if count > _MAX_OPS:
                return
            name, pushed = op.name, None
            if name in _STRING_OPS:
                pushed = arg.decode("latin-1") if isinstance(arg, bytes) else str(arg)
            elif name in ("GLOBAL", "INST"):
                found.append(str(arg).replace(" ", "."))
            elif name == "STACK_GLOBAL":
                found.append(".".join(strings[-2:]) if len(strings) >= 2 else "?")
            elif name in ("MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"):  # store the top; the stack is unchanged
                memo[len(memo) if name == "MEMOIZE" else int(arg)] = top
                continue
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                pushed = memo.get(int(arg))
            if pushed is not None:
                strings.append(pushed)
            top = pushed
    except (ValueError, EOFError, UnicodeDecodeError, TypeError):
        stream.seek(0, io.SEEK_END)
