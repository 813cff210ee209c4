"""Naming the globals a pickle references, without unpickling it.

``torch.load(weights_only=True)`` refuses a pickle that references anything outside its
allow-list, but for pickle protocols 4 and 5 it stops at the first ``FRAME`` opcode and
never says which global the file wanted. ``referenced_globals`` walks the opcodes with
``pickletools.genops`` (a disassembler: it builds no object and calls nothing) and returns
``module.name`` for every ``GLOBAL``, ``INST`` and ``STACK_GLOBAL`` (and a copyreg extension,
``EXT1``/``EXT2``/``EXT4``, as ``<copyreg extension N>``); for ``STACK_GLOBAL`` the two operands
are the top two pushes, followed through string pushes and the memo, which is how every Python
pickler writes them. Any other opcode counts as a push of something else, so operands moved by
``POP`` or ``DUP`` are not followed: such a name, which no pickler writes, is ``<unresolved>``
(an allow-list then refuses it; ``training.checkpoint_io`` checks the resume state so).
"""

from __future__ import annotations

import io
import pickletools
import re

from divergence.errors import CheckpointError

_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
_MAX_OPS = 10_000_000  # a bound on work for a hostile file; real data.pkl files have a few thousand


def referenced_globals(data: bytes, strict: bool = False) -> list[str]:
    """``module.name`` of every global the pickle(s) in ``data`` reference, in order of first use.

    ``data`` may hold several pickles back to back (torch's legacy format does); scanning
    stops quietly at the first byte that is not a valid opcode, or, ``strict``, raises ``ValueError``.
    """
    found: list[str] = []
    stream = io.BytesIO(data)
    while stream.tell() < len(data):
        start = stream.tell()
        _scan_one(stream, found, strict)
        if stream.tell() == start:
            break
    return list(dict.fromkeys(found))


def unsafe_globals(data: bytes, allowed=()) -> list[str]:
    """Globals the pickle(s) in ``data`` reference outside torch's weights-only allow-list and ``allowed``."""
    from torch import _weights_only_unpickler as weights_only

    safe = set(weights_only._get_allowed_globals()) | {f"{g.__module__}.{g.__name__}" for g in allowed}
    return [g for g in referenced_globals(data) if g not in safe]


def refusal(where, err: BaseException, data: bytes, allowed=(), advice: str = "") -> CheckpointError | None:
    """The refusal of a pickle the weights-only unpickler stopped at (``err``) for a global outside its
    allow-list and ``allowed``, naming it (``err``'s, else the first in ``data``); None when it named none."""
    named = re.search(r"GLOBAL ([\w.]+)", str(err))
    unsafe = [named.group(1)] if named else unsafe_globals(data, allowed)
    if not unsafe:
        return None
    return CheckpointError(
        f"{where}: refused to unpickle: it references {unsafe[0]}, which could run code. "
        f"divergence loads only tensors and plain containers{advice}"
    )


def _scan_one(stream: io.BytesIO, found: list[str], strict: bool) -> None:
    pushed: list[str | None] = []  # each push: its string, or None for anything else
    memo: dict[int, str | None] = {}
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(stream)):
            if count > _MAX_OPS:
                raise ValueError(f"more than {_MAX_OPS:,} opcodes")
            name = op.name
            if name in ("GLOBAL", "INST"):
                found.append(str(arg).replace(" ", "."))
            elif name == "STACK_GLOBAL":
                module, attr = pushed[-2:] if len(pushed) >= 2 else (None, None)
                found.append(
                    f"{module}.{attr}" if isinstance(module, str) and isinstance(attr, str) else "<unresolved>"
                )
            elif name.startswith("EXT"):
                found.append(f"<copyreg extension {arg}>")
            if name in _STRING_OPS:
                pushed.append(arg.decode("latin-1") if isinstance(arg, bytes) else str(arg))
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                pushed.append(memo.get(int(arg)))
            elif name in ("MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"):  # store the top; the stack is unchanged
                memo[len(memo) if name == "MEMOIZE" else int(arg)] = pushed[-1] if pushed else None
            else:
                pushed.append(None)
    except (ValueError, EOFError, UnicodeDecodeError, TypeError) as err:
        if strict:
            raise ValueError(f"unreadable pickle: {err}") from None
        stream.seek(0, io.SEEK_END)
