"""Wall and CPU time of a ``divergence train`` child started with ``Popen`` and forked from the zygote.

Each child trains the tiny recipe for one step (no samples, no wandb), one at a time, the two
ways alternating (so a change of the machine's load hits both alike). A ``Popen`` child's CPU is
ours to read (``RUSAGE_CHILDREN``); a forked child is the zygote's, whose ``/proc`` stat counts
the CPU of the children it reaped. The zygote's own start (its imports, paid once per study) is
printed apart.

Then ``--pairs`` separate-job pairs the same two ways: a data-parallel pair on the tiny DiT (arm a
2 gloo ranks of 8, arm b 1 process of 16, 2 steps): ``divergence train`` of the pair, its two arm
jobs, arm a's rank 1 and the comparator. With ``Popen`` each of the first three is a fresh
interpreter; forked, each is the zygote's child. Either way arm a's rank 1 is a fresh interpreter
that Lightning's launcher starts from rank 0 and never waits for; this process is made the
subreaper of such orphans (``PR_SET_CHILD_SUBREAPER``), so that each is reaped here and counted in
``RUSAGE_CHILDREN``, beside what the zygote reaped.

    python benchmarks/child_start.py [--children 3] [--pairs 1] [key=value ...]
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
RECIPES = Path(__file__).resolve().parents[1] / "recipes"
PAIR = """name: data-parallel-dit
base: {recipes}/tiny-dit.yaml
arms:
  a: [{{data-parallel: 2x8}}]
  b: [{{data-parallel: 1x16}}]
"""
PAIR_QUICK = [
    "train.max_steps=2",
    "train.checkpoint_every=2",
    "train.cpu_threads=1",
    "sample.enabled=false",
    "log.wandb=false",
    "log.progress_bar=false",
    "tracking.every=1",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=3, help="children each way")
    parser.add_argument("--pairs", type=int, default=1, help="separate-job data-parallel DiT pairs each way")
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
        _summary("child", times)
        if args.pairs:
            _set_subreaper()
            pair = Path(scratch) / "data-parallel-dit.yaml"
            pair.write_text(PAIR.format(recipes=RECIPES))
            pairs: dict[str, list[tuple[float, float]]] = {"popen": [], "fork": []}
            for i in range(args.pairs):
                for mode in pairs:
                    out = Path(scratch) / f"pair-{mode}{i}"
                    command = [sys.executable, "-m", "divergence", "train", "--recipe", str(pair), "--out", str(out)]
                    pairs[mode].append(_one([*command, *PAIR_QUICK], envs[mode], zygote.process.pid))
                    print(f"{mode:>5} pair {i}:  {pairs[mode][-1][0]:6.2f} s wall, {pairs[mode][-1][1]:6.2f} s CPU")
            _summary("pair", pairs)


def _summary(what: str, times: dict[str, list[tuple[float, float]]]) -> None:
    mean = {mode: [sum(column) / len(rows) for column in zip(*rows)] for mode, rows in times.items()}
    for mode, (wall, cpu) in mean.items():
        print(f"{mode:>5} {what} mean: {wall:6.2f} s wall, {cpu:6.2f} s CPU")
    print(
        f"{what}, popen / fork: {mean['popen'][0] / mean['fork'][0]:.2f}x wall, "
        f"{mean['popen'][1] / mean['fork'][1]:.2f}x CPU"
    )


def _set_subreaper() -> None:
    """Orphans of our descendants (a Popen rank 1 whose rank 0 has exited) become our children: reaped
    here, their CPU counted in ``RUSAGE_CHILDREN`` (``prctl(2)``: ``PR_SET_CHILD_SUBREAPER``)."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise SystemExit(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")


def _reap_orphans(keep: int) -> None:
    """Wait for every child of ours but ``keep`` (the zygote): the orphans handed to us as subreaper."""
    while True:
        mine = [p for p in _children(os.getpid()) if p != keep]
        if not mine:
            return
        for pid in mine:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError):
            pass
    return found


def _one(command: list[str], env: dict[str, str], zygote: int) -> tuple[float, float]:
    """One child's wall and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    _, reaped = _zygote_cpu(zygote)
    start = time.perf_counter()
    child = child_start.start(command, env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    code = child.wait()
    _reap_orphans(keep=zygote)
    wall = time.perf_counter() - start
    if code:
        raise SystemExit(f"{' '.join(command)}: exit {code}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)  # Popen'd, or orphans
    return wall, ours + _zygote_cpu(zygote)[1] - reaped  # the zygote's reaped: every forked child


def _zygote_cpu(pid: int) -> tuple[float, float]:
    """The zygote's own CPU seconds, and those of the children it reaped (``proc(5)``: utime, stime, cutime, cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(f) / TICKS for f in fields[11:15])
    return utime + stime, cutime + cstime


if __name__ == "__main__":
    main()
