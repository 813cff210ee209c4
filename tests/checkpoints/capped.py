"""Commands run where a regression cannot hurt the machine: a time limit, and a memory cap.

``run_capped`` runs ``divergence`` command lines in one child process, after raising its
address-space limit (``RLIMIT_AS``) to only ``extra_mb`` above what the imports already took,
so a reader that reads ``/dev/zero`` or allocates what a crafted file declares fails with
MemoryError in the child instead of taking the machine's memory; each command has
``seconds`` (``SIGALRM``), and the child as a whole a timeout, so a FIFO that blocks a read is
a failed case, not a hung suite. ``deadline`` is the same time limit in-process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

_CHILD = r"""
import contextlib, io, json, resource, signal, sys
import torch  # everything a command imports, imported before the cap
import divergence.checkpoints.compare, divergence.cli.compare, divergence.cli.track
from divergence.cli import main

class Expired(BaseException):
    pass

def expire(signum, frame):
    raise Expired()

vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:")) * 1024
extra, seconds, commands = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (vm + extra * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))
signal.signal(signal.SIGALRM, expire)
results = []
for argv in commands:
    err = io.StringIO()
    signal.alarm(seconds)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    except Expired:
        code = "timeout"
    except BaseException as exc:  # a traceback the command line would have shown
        code = f"raised {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.alarm(0)
    results.append([code, err.getvalue().strip().splitlines()])
print("RESULTS " + json.dumps(results))
"""


def run_capped(commands: list[list[str]], extra_mb: int = 512, seconds: int = 20) -> list[tuple]:
    """``[(exit code or what went wrong, stderr lines)]`` of each command (see the module docstring)."""
    # one BLAS/OpenMP thread and two malloc arenas: each more thread reserves tens of MB of
    # address space it never uses, which the cap would count
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(extra_mb), str(seconds), json.dumps(commands)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60 + seconds * len(commands),
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULTS ")), None)
    assert line is not None, (proc.returncode, proc.stderr[-2000:])
    return [tuple(r) for r in json.loads(line.removeprefix("RESULTS "))]


class Expired(BaseException):
    """Not an ``Exception`` (nor an ``OSError``, which readers turn into "cannot read"): nothing catches it."""


@contextlib.contextmanager
def deadline(seconds: int):
    """Raise ``Expired`` in the block after ``seconds`` (a blocked ``open`` of a FIFO included)."""

    def expire(signum, frame):
        raise Expired(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
