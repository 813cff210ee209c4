"""SIGTERM and SIGHUP (a scheduler's stop, a closed terminal) raised as ``Stopped``, handled like Ctrl-C.

A process that starts children (the study's pair runs, a separate-job pair's arm jobs) must end
them when it is stopped; inside ``signals_raise()`` those signals raise ``Stopped``, a
``KeyboardInterrupt``, so the code that ends the children on Ctrl-C ends them on these too, and the
command line exits as after Ctrl-C.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """The process was sent SIGTERM or SIGHUP; handled like Ctrl-C (its children are ended)."""


@contextmanager
def signals_raise() -> Iterator[None]:
    """Inside: SIGTERM and SIGHUP raise ``Stopped``. Only the main thread can set handlers; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, _frame):
        raise Stopped(f"stopped by {signal.Signals(signum).name}")

    previous = {s: signal.signal(s, stop) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
