"""Wall and CPU time of a ``divergence train`` child started with ``Popen`` and forked from the zygote.

Each child trains the tiny recipe for one step (no samples, no wandb), one at a time, the two
ways alternating (so a change of the machine's load hits both alike). A ``Popen`` child's CPU is
ours to read (``RUSAGE_CHILDREN``); a forked child is the zygote's, whose ``/proc`` stat counts
the CPU of the children it reaped. The zygote's own start (its imports, paid once per study) is
printed apart.

    python benchmarks/child_start.py [--children 3] [key=value ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from divergence.training import child_start

TICKS = os.sysconf("SC_CLK_TCK")
ONE_STEP = ["train.max_steps=1", "sample.enabled=false", "log.wandb=false", "log.progress_bar=false"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=3, help="children each way")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, e.g. train.batch_size=2")
    args = parser.parse_args()
    envs = {mode: dict(os.environ, **{child_start.MODE_VARIABLE: mode}) for mode in ("popen", "fork")}
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        zygote = child_start._zygote(envs["fork"])
        assert zygote is not None, "the zygote did not start"
        own, _ = _zygote_cpu(zygote.process.pid)
        print(f"zygote start: {time.perf_counter() - start:6.2f} s wall, {own:6.2f} s CPU (once)")
        times: dict[str, list[tuple[float, float]]] = {"popen": [], "fork": []}
        for i in range(args.children):
            for mode in times:
                out = Path(scratch) / f"{mode}{i}"
                command = [sys.executable, "-m", "divergence", "train", "--out", str(out), *ONE_STEP, *args.overrides]
                times[mode].append(_one(command, envs[mode], zygote.process.pid))
                print(f"{mode:>5} child {i}: {times[mode][-1][0]:6.2f} s wall, {times[mode][-1][1]:6.2f} s CPU")
    mean = {mode: [sum(column) / len(rows) for column in zip(*rows)] for mode, rows in times.items()}
    for mode, (wall, cpu) in mean.items():
        print(f"{mode:>5} mean:    {wall:6.2f} s wall, {cpu:6.2f} s CPU")
    print(
        f"popen / fork: {mean['popen'][0] / mean['fork'][0]:.2f}x wall, {mean['popen'][1] / mean['fork'][1]:.2f}x CPU"
    )


def _one(command: list[str], env: dict[str, str], zygote: int) -> tuple[float, float]:
    """One child's wall and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    _, reaped = _zygote_cpu(zygote)
    start = time.perf_counter()
    child = child_start.start(command, env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    code = child.wait()
    wall = time.perf_counter() - start
    if code:
        raise SystemExit(f"{' '.join(command)}: exit {code}")
    if isinstance(child, child_start.ForkedChild):
        return wall, _zygote_cpu(zygote)[1] - reaped
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _zygote_cpu(pid: int) -> tuple[float, float]:
    """The zygote's own CPU seconds, and those of the children it reaped (``proc(5)``: utime, stime, cutime, cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(f) / TICKS for f in fields[11:15])
    return utime + stime, cutime + cstime


if __name__ == "__main__":
    main()
