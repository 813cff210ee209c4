"""Wait for a pair folder the arms have not created yet.

A scheduler may start the comparator before either arm has run a line (``submit.sh`` starts it
once both arm jobs have *started*; a requeued comparator may start before a requeued arm), so
``watch`` waits for the folder and its pair files instead of failing. The arm that starts first
writes ``pair.yaml`` and then ``pair.json`` (each atomically, by the arm that starts first):
once ``pair.json`` exists, both do.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from divergence.pairfolder.folder import PairFolder, as_pair_folder


def pair_started(pair_folder: PairFolder | Path) -> bool:
    return as_pair_folder(pair_folder).pair_json.is_file()


def wait_for_pair(pair_folder: PairFolder | str | Path, poll: float, timeout: float | None, say=None) -> bool:
    """True once ``pair_folder`` holds a started pair; False when ``timeout`` seconds passed first
    (None: wait as long as it takes). Says once, on stderr, what it waits for."""
    pair_folder = as_pair_folder(pair_folder)
    if pair_started(pair_folder):
        return True
    (say or _stderr)(f"divergence watch: waiting for {pair_folder.pair_json} (the arms create it when they start)")
    start = time.monotonic()
    while not pair_started(pair_folder):
        if timeout is not None and time.monotonic() - start > timeout:
            return False
        time.sleep(min(poll, timeout) if timeout is not None else poll)
    return True


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
