"""``divergence watch DIR``: the metrics store of a pair whose arms train as separate jobs.

For each step in order it waits until both arms have written what the lockstep tracker
would have had in memory at that step (both losses; at a tracked step also both complete
weights files), then builds the step's records with ``divergence.tracking.records`` (so the
store equals the lockstep store record for record), appends them and logs them. It stops
when the store holds the last step and both arms report ``finished``.

Restart-safe: the store is append-only with committed step blocks, so a killed comparator
loses at most the step in flight; started again it continues after ``MetricsStore.last_step``
and rebuilds the spike detectors from the stored losses (they saw exactly those). An arm
that restarts from an earlier checkpoint (a new ``attempt`` in its status, ``start_step`` G)
recomputes the steps after G, so the comparator drops its records after G and follows the
new attempt, as the lockstep tracker does on resume. The attempts it has followed are kept
in ``DIR/watch.json``. With ``tracking.keep`` it deletes the weights files of compared and
stored steps (``divergence.comparator.retention``).

Under torchrun, rank 0 plans and writes (``comparator.planner.Planner``); every rank measures its
share of each checkpoint pair (``comparator.distributed.measure``); the
two share one record of each turn (``comparator.planner.Task``), which rank 0 broadcasts.

A step that can never come (an arm ended before it, or with a gap where it should be; no arm
folders at all) is stated in one line and exit code 2 (``divergence.comparator.stalls``); arms
that are running are waited for. Arms that record every ``tracking.stride``-th step are followed
at those steps. The pair's length is read from the arms at every look, never frozen: where both
arms finished (an open-ended pair, ``ArmWriter`` without ``max_steps``, or an early stop), else
the ``max_steps`` the writers were told; a step before it is taken once an arm has recorded past
it (so it is known not to be the last) or both arms have ended, and an open pair's ``pair.json``
then gets the last step as ``max_steps`` (with ``open_ended``: arms resumed after it train on,
and a later watch follows them). A ``running`` arm whose lock no process holds has died: one line.

It reads only the pair-folder contract (``divergence.pairfolder``: the schedule from ``pair.json``)
and imports nothing from the training package. The function-space probe (``tracking.probe``)
runs on rank 0 at the tracked steps ``probe_due`` picks (as in lockstep) of a pair the built-in
trainer trains (``pair.yaml`` present): both arms' weights files are loaded into two models built
from the pair's recipe and evaluated on the same probe set (the built-in trainer's ``FileProbe``, handed in by ``divergence watch``,
fp32, baseline attention), so
the store gets ``probe_rel_diff, probe_loss_a, probe_loss_b`` equal to the lockstep tracker's.

A scheduler may start the comparator before either arm has run a line (``submit.sh`` starts it
once both arm jobs have *started*; a requeued comparator may start before a requeued arm), so
``watch`` waits for the folder and its pair files instead of failing (``wait_for_pair``). The arm
that starts first writes ``pair.yaml`` and then ``pair.json`` (each atomically): once
``pair.json`` exists, both do.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

from divergence.comparator.distributed import Ranks, measure
from divergence.comparator.planner import Planner, Task
from divergence.errors import UserInputError
from divergence.pairfolder.folder import PairFolder
from divergence.pairfolder.folder import as_pair_folder
from divergence.pairfolder.schedule import read_schedule


class Comparator:
    def __init__(
        self,
        out: str | Path | PairFolder,
        ranks: Ranks | None = None,
        device="cpu",
        log: bool = True,
        progress: bool = True,
        probe=None,
        prefetch: bool = True,
        wandb: bool = True,
    ):
        """``out``: the pair folder (a path, or the ``PairFolder``); ``wandb=False``: the logs without
        their wandb run, whatever the pair's ``log.wandb`` (``log=False``: no logs at all); ``probe``: the function-space probe's
        factory ``(PairSchedule, device) -> probe`` (``due(step)``, ``record(paths)``), used when the
        pair's ``tracking.probe`` is enabled; ``divergence watch`` passes the built-in trainer's
        ``FileProbe`` (``training.probe_files``). None: no probe."""
        self.pair_folder, self.ranks = as_pair_folder(out), ranks or Ranks()
        self.pair = read_schedule(self.pair_folder)
        if not wandb:
            self.pair = replace(self.pair, log=replace(self.pair.log, wandb=False))
        self.device = device
        self.planner: Planner | None = None  # rank 0's; the other ranks only measure
        failed = None
        if self.ranks.is_zero:
            try:
                self.planner = Planner(self.pair_folder, self.pair, device, log, progress, probe, prefetch)
            except UserInputError as err:
                failed = str(err)
        failed = self.ranks.broadcast(failed)  # every rank stops, not only rank 0
        if failed is not None:
            raise UserInputError(failed)

    def run(self, poll: float = 5.0, timeout: float | None = None) -> int:
        """Follow the arms until the pair is complete; 0 when done, 2 on bad input (an unmatchable
        checkpoint pair, an unreadable file), 1 after ``timeout`` seconds without progress (a
        stored step, new losses, an arm's status changing), whatever else happens."""
        try:
            while True:
                task = self.ranks.broadcast(self.planner.plan(timeout) if self.planner else None)
                if task.kind == "done":
                    if self.planner:
                        self.planner.finish()
                    return 0
                if task.kind == "stop":
                    if self.planner:
                        print(f"divergence watch: {task.message}", file=sys.stderr)
                    return task.code
                if task.kind == "wait" or not self._take(task):
                    time.sleep(poll)
        finally:
            if self.planner:
                self.planner.close()

    def _take(self, task: Task) -> bool:
        """Every rank measures ``task``'s step, rank 0 records it; False when a file was replaced
        meanwhile (retried next poll)."""
        if self.planner:
            self.planner.before(task)
        measured = measure(task, self.ranks, self.device)
        return self.planner.record(task, measured) if self.planner else True


def wait_for_pair(pair_folder: PairFolder | str | Path, poll: float, timeout: float | None, say=None) -> bool:
    """True once ``pair_folder`` holds a started pair (its ``pair.json``); False when ``timeout`` seconds
    passed first (None: wait as long as it takes). Says once, on stderr, what it waits for."""
    pair_json = as_pair_folder(pair_folder).pair_json
    if pair_json.is_file():
        return True
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    say(f"divergence watch: waiting for {pair_json} (the arms create it when they start)")
    start = time.monotonic()
    while not pair_json.is_file():
        if timeout is not None and time.monotonic() - start > timeout:
            return False
        time.sleep(min(poll, timeout) if timeout is not None else poll)
    return True
