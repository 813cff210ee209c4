"""Train a study's pairs: each pair run a ``divergence train`` child process, ``jobs`` at a time.

Replicate r of a pair trains into ``DIR/<pair name>/r<r>/`` from ``DIR/recipes/<pair name>-r<r>.yaml``
(the pair recipe with ``replicate: r``), with its own log in ``DIR/logs/<pair name>-r<r>.log``;
(pair name, replicate) is unique. A pair run whose ``pair.json`` says it finished the requested
steps is not trained again; any
other resumes from its last checkpoint (that is what ``divergence train`` does on an
existing folder), so an interrupted study picks up where it stopped. Both only for a run of the
same recipe, and none while a live process writes its folder (``study.reuse``, checked before
anything is written). A pair run that fails other than on bad input is started once more
(``RESTARTS``), resuming from its last checkpoint, before the study fails. Progress is a bar per
pair and one overall, read from the pairs' metrics stores.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from divergence.errors import RecipeError, UserInputError
from divergence.pairfolder.arm.losses import tail_step
from divergence.pairfolder.folder import PairFolder
from divergence.pairfolder.layout import ARMS
from divergence.pairfolder.pair_json import PairInfo
from divergence.variants.pair_recipe import load_pair_recipe
from divergence.store import MetricsStore
from divergence.study.config import Study, StudyPair, in_study
from divergence.study import shared_arms
from divergence.training.stop_signals import signals_raise
from divergence.study.reuse import check_reusable
from divergence.training import child_start
from divergence.training.pair_setup import pair_config
from divergence.training.host import check_host
from divergence.training.separate_pair import STOP_SECONDS, arm_command, arm_finished, on_cpu, separate_jobs

POLL_SECONDS = 0.2  # how soon a study sees a pair run end and starts the next (a core idles meanwhile)
DISK_FULL = "No space left on device"  # strerror(ENOSPC), in a child's OSError line
# A pair run that fails (any exit but 0, or 2: bad input, the same however often it runs) is started once
# more, from its last checkpoint, before the study fails: a rank's crash (a segfault in a gloo thread)
# need not cost a two-hour atlas. torchrun's --max-restarts is the same idea (its default is 0: one
# process group, not a queue of independent runs).
RESTARTS = 1
FOLLOWERS_PER_CORE = 2  # pair runs at once, at most, per parallel slot: training ones and comparators that follow


class PairFailed(Exception):
    """A pair's training process failed; ``exit_code`` is its exit status (2: bad input)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class PairJob:
    pair: StudyPair
    recipe_path: Path
    out: Path
    max_steps: int
    process: subprocess.Popen | child_start.ForkedChild | None = None
    skipped: bool = False
    replicate: int = 0
    recipe_text: str = ""
    config: dict | None = None  # the resolved pair as ``train`` saves it (``pair.yaml``): what a reused run must match
    log_start: int = 0  # where this job's child began writing its log (earlier attempts wrote before it)
    cores: int = 1  # cores its widest arm keeps busy at once (``arm_cores``: a 2-rank arm, a 2-thread CPU arm: 2)
    arm_cores: tuple[int, ...] = ()  # a separate-job pair's: each arm's cores, in the order they train (a, b)
    restarts: int = 0  # how often it was started again after a failure (``RESTARTS`` at most)
    sharing: dict = field(default_factory=dict)  # what the shared-arms plan reads (``shared_arms.sharing_facts``)
    borrowed: dict = field(default_factory=dict)  # {arm: the owner's arm folder}: trained by another pair run
    lends: bool = False  # other pair runs read its arms (``shared_arms``)

    @property
    def label(self) -> str:
        """``<pair name>-r<replicate>``: names its recipe, its log and its progress bar."""
        return f"{self.pair.name}-r{self.replicate}"

    def done_steps(self) -> int:
        """Progress only: the last step record near the store's end (polled several times a second,
        so never a parse of the whole store). A pair whose arms train as separate jobs (arm a, then
        arm b, then the comparator: ``training.separate_pair``) writes its store last, so its
        progress is the mean of the three: each arm's last loss step, and the store's."""
        stored = MetricsStore(self.out).tail_step() or 0
        arms = [self.out / arm for arm in ARMS if (self.out / arm).is_dir()]
        if not arms:
            return stored
        return (sum(tail_step(arm) for arm in arms) + stored) // (len(ARMS) + 1)

    def cores_now(self) -> int:
        """The cores it keeps busy at this moment (started or not): a separate-job pair trains arm a,
        then arm b, then compares in one process (``training.separate_pair``), so its count is that
        of its first unfinished arm, then 1; a lockstep pair's is ``cores`` throughout. A comparator
        that follows an arm another pair still trains (``shared_arms``) keeps none: it reads each
        step as the lender writes it (measured: 6% of a core beside a lockstep pair at 72%), so it
        does not hold a slot a training pair could use."""
        if not self.arm_cores:
            return self.cores
        folder = PairFolder(self.out)
        own = [(arm, n) for arm, n in zip(ARMS, self.arm_cores) if arm not in self.borrowed]
        training = next((n for arm, n in own if not arm_finished(folder, arm, self.max_steps)), None)
        if training is not None:
            return training
        return 0 if self.following() else 1

    def following(self) -> bool:
        """Whether a borrowed arm is still being trained by its owner (this pair's comparator follows it)."""
        return any(not arm_finished(PairFolder(o.parent), o.name, self.max_steps) for o in self.borrowed.values())

    def ready(self) -> bool:
        """Whether it has work now (``next_ready``): an arm of its own to train, or borrowed arms all finished."""
        return len(self.borrowed) < len(ARMS) or not self.following()

    def finished(self) -> bool:
        try:
            info = PairInfo.read(self.out)
        except UserInputError:
            return False
        return info.finished and (info.last_step or 0) >= self.max_steps


def plan_jobs(study: Study, out: Path, overrides: list[str]) -> list[PairJob]:
    """One job per (pair, replicate), replicate-major (the first replicate of every pair finishes
    first). Each recipe is read back from a scratch folder, so a bad one fails here, naming its key
    in the study recipe, and nothing is written under ``out``."""
    jobs = []
    with tempfile.TemporaryDirectory() as scratch:
        for replicate in range(study.replicates):
            for pair in study.pairs:
                if replicate and pair.single:
                    continue
                text = yaml.safe_dump({**pair.recipe, "replicate": replicate}, sort_keys=False)
                checked = Path(scratch) / f"{pair.name}-r{replicate}.yaml"
                checked.write_text(text)
                try:
                    resolved = load_pair_recipe(checked, overrides)
                    check_host(*resolved.arm_recipes.values())  # the study trains its pairs on this machine
                except RecipeError as err:
                    raise RecipeError(in_study(str(err).replace(f"{checked}: ", ""), pair, study)) from None
                jobs.append(
                    PairJob(
                        pair,
                        out / "recipes" / checked.name,
                        out / pair.name / f"r{replicate}",
                        resolved.base.train.max_steps,
                        replicate=replicate,
                        recipe_text=text,
                        config=pair_config(resolved),
                        cores=max(arm_cores(resolved)),
                        arm_cores=arm_cores(resolved) if separate_jobs(resolved) else (),
                        sharing=shared_arms.sharing_facts(resolved, pair.role),
                    )
                )
    return jobs


def arm_cores(pair) -> tuple[int, ...]:
    """The cores each arm keeps busy, arm a first: its processes (``train.devices`` x
    ``train.num_nodes``), times its intra-op threads on a CPU (``train.cpu_threads``; 0, torch's
    default, is every core). A 2-thread CPU arm beside another pair's job would share a core with
    it: both slow down, and its step time no longer says what 2 threads cost (the first CPU atlas
    read the ``cpu-threads`` row's 2 threads as 2.1x slower than 1).

    >>> from types import SimpleNamespace as N
    >>> arm = lambda threads: N(train=N(devices=1, num_nodes=1, cpu_threads=threads, accelerator="cpu"))
    >>> arm_cores(N(arm_recipes={"a": arm(2), "b": arm(1)}))
    (2, 1)
    """
    return tuple(_cores(pair.arm_recipes[arm].train) for arm in ARMS)


def _cores(train) -> int:
    processes = train.devices * train.num_nodes
    if not on_cpu(train.accelerator):
        return processes
    return processes * (train.cpu_threads or os.cpu_count() or 1)


def write_recipes(jobs: list[PairJob]) -> None:
    """Each job's recipe into ``DIR/recipes/``, once no run folder is written by a live process and every
    run folder a job would reuse holds its recipe (``study.reuse``): a one-line error, nothing written."""
    check_reusable(jobs)
    for job in jobs:
        job.recipe_path.parent.mkdir(parents=True, exist_ok=True)
        job.recipe_path.write_text(job.recipe_text)


def run_jobs(
    jobs: list[PairJob], overrides: list[str], parallel: int, show_progress: bool = True, shared: bool = True
) -> dict:
    """Train every unfinished pair, ``parallel`` at a time; raise PairFailed naming a failed pair.

    ``shared``: every arm of a replicate trained once, whatever pairs it belongs to
    (``study.shared_arms``); else every pair both its arms. Returns ``DIR/arms.json`` as written
    (its ``arm_steps``: trained, and pair by pair)."""
    from tqdm import tqdm

    _log_path(jobs[0]).parent.mkdir(parents=True, exist_ok=True)
    root = _log_path(jobs[0]).parent.parent
    jobs = start_order(jobs)
    record = shared_arms.assign(jobs, root) if shared else shared_arms.record_pair_by_pair(jobs, root)
    tqdm.write(f"divergence: {shared_arms.describe(record)}", file=sys.stderr)
    for job in jobs:
        job.skipped = job.finished()
    total = sum(j.max_steps for j in jobs)
    bars = {
        j.label: tqdm(
            total=j.max_steps, desc=f"{j.label:<22}", position=i + 1, leave=True, disable=not show_progress, unit="step"
        )
        for i, j in enumerate(jobs)
    }
    overall = tqdm(total=total, desc=f"{'study':<22}", position=0, leave=True, disable=not show_progress, unit="step")
    waiting = [j for j in jobs if not j.skipped]
    running: list[PairJob] = []
    try:
        with signals_raise():  # SIGTERM and SIGHUP, like Ctrl-C, reach the except below
            while waiting or running:
                while (job := next_ready(waiting, running)) is not None and fits(job, running, parallel):
                    waiting.remove(job)
                    running.append(_start(job, overrides))
                time.sleep(POLL_SECONDS)
                _update(jobs, bars, overall)
                for job in [j for j in running if j.process.poll() is not None]:
                    running.remove(job)
                    if _restarts(job):
                        waiting.insert(0, job)  # next to start: from its checkpoint, its log appended to
                    elif (code := job.process.returncode) != 0:
                        again = "failed again, after a restart from its checkpoint"
                        raise PairFailed(_failure(job, again if job.restarts else "failed"), code)
            _update(jobs, bars, overall)
    except BaseException:
        _end([j.process for j in running])
        raise
    finally:
        for bar in (*bars.values(), overall):
            bar.close()
    return record


def next_ready(waiting: list[PairJob], running: list[PairJob]) -> PairJob | None:
    """The first waiting job with work to do now: one that trains an arm of its own, or whose borrowed
    arms have all finished. A pair that only compares arms others train (``shared_arms``) would hold a
    core while it waits for them: it starts once they have finished, and the jobs after it go first.
    With nothing running, the first waiting job (its comparator then says what it waits for)."""
    ready = next((job for job in waiting if job.ready()), None)
    return ready if ready is not None or running else next(iter(waiting), None)


def start_order(jobs: list[PairJob]) -> list[PairJob]:
    """The order ``run_jobs`` starts ``jobs`` in: replicate by replicate, as planned, and within a
    replicate the pairs that start on several processes first, those that stay on several longest
    first (a lockstep multi-rank pair, or separate-job arms of 2 and 2 ranks, before arms of 2 and 1),
    then the rest in their planned order.

    Why: a job waits for room rather than being passed (``fits``), so a 2-process job planned
    after 1-process ones waits with a core idle until the 1-process job beside it ends (in the
    first CPU atlas run, 4 such waits per replicate of the UNet, about a minute each). Grouped at
    the replicate's start, the 2-process jobs follow one another, and a separate-job pair's
    1-process phase runs beside the first 1-process job.

    >>> one, two = PairJob(None, None, None, 1), PairJob(None, None, None, 1, cores=2)
    >>> split = PairJob(None, None, None, 1, cores=2, arm_cores=(2, 1))
    >>> later = PairJob(None, None, None, 1, cores=2, replicate=1)
    >>> [j is k for j, k in zip(start_order([one, split, later, two]), [two, split, one, later])]
    [True, True, True, True]
    """

    def key(job: PairJob) -> tuple[int, bool, int, int]:
        widths = job.arm_cores or (job.cores,) * len(ARMS)  # a lockstep pair: all its time on ``cores``
        lends_first = not job.sharing.get("lockstep", False)  # it never borrows: it owns its arms
        return job.replicate, lends_first, -widths[0], -sum(width > 1 for width in widths)

    return sorted(jobs, key=key)


def fits(job: PairJob, running: list[PairJob], parallel: int) -> bool:
    """Whether ``job`` starts beside ``running``: the cores they keep busy now (``PairJob.cores_now``)
    within ``parallel``, or nothing running. While a separate-job pair trains its 2-rank arm it
    takes 2 of the slots, so on 2 cores that arm trains alone (gloo ranks sharing a core wait on each
    other at every collective); its 1-process arm and its comparator take one, beside another pair.
    Jobs start in their order: the next waits for room rather than being passed by a smaller one.
    A comparator that follows a lender's arm keeps no core (``PairJob.cores_now``); at most
    ``FOLLOWERS_PER_CORE x parallel`` pair runs are started at once, whatever they keep busy.

    >>> one, two = PairJob(None, None, None, 1), PairJob(None, None, None, 1, cores=2)
    >>> fits(one, [one], 2), fits(two, [one], 2), fits(two, [], 2)
    (True, False, True)
    """
    busy = sum(j.cores_now() for j in running) + job.cores_now()
    return not running or (busy <= parallel and len(running) < FOLLOWERS_PER_CORE * parallel)


def _end(processes: list[subprocess.Popen]) -> None:
    """Stop every child: SIGTERM (its store is committed step by step; Lightning stops at a step's end),
    SIGKILL for those still running after ``STOP_SECONDS``, and reap them all, so none outlives the study."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _start(job: PairJob, overrides: list[str]) -> PairJob:
    command = arm_command(job.recipe_path, job.out, [*overrides, "log.progress_bar=false"])
    # no thread count here: train.cpu_threads is the recipe's, the same whatever ``parallel`` (a
    # CPU's numbers depend on it), so a study gives the same numbers with --jobs 1 and --jobs 2
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}  # each job its own wandb service
    env.setdefault("WANDB_RUN_GROUP", job.out.parent.name)  # one wandb group: the study folder's name
    job.out.mkdir(parents=True, exist_ok=True)
    shared_arms.link_borrowed(job)
    if job.lends:
        command.append("--lend-arms")
    log = open(_log_path(job), "a")
    job.log_start = log.tell()
    job.process = child_start.start(command, env, stdout=log, stderr=subprocess.STDOUT)  # forked or Popen
    log.close()
    return job


def _update(jobs: list[PairJob], bars: dict, overall) -> None:
    done = 0
    for job in jobs:
        steps = job.max_steps if job.skipped else min(job.done_steps(), job.max_steps)
        bar = bars[job.label]
        bar.update(steps - bar.n)
        done += steps
    overall.update(done - overall.n)


def _restarts(job: PairJob) -> bool:
    """Whether ``job``, just ended, starts again: it failed other than with exit 2 or a full disk (a
    restart would fail the same) and has restarts left.
    Says so in one line above the progress bars (``tqdm.write``): the failure, and that it resumes."""
    from tqdm import tqdm

    code = job.process.returncode
    if code in (0, 2) or job.restarts >= RESTARTS or DISK_FULL in _last_line(_log_path(job), job.log_start):
        return False
    job.restarts += 1
    tqdm.write(f"divergence: {_failure(job)}; starting it again from its last checkpoint", file=sys.stderr)
    return True


def _failure(job: PairJob, failed: str = "failed") -> str:
    """``pair <name> (replicate <r>) <failed> (exit <code>): <its last line> [full log: <log>]``."""
    log = _log_path(job)
    last = _last_line(log, job.log_start)
    said = f"pair {job.pair.name} (replicate {job.replicate}) {failed} (exit {job.process.returncode}): {last} [full log: {log}]"
    if DISK_FULL in last:
        return f"{said}; free disk space (a pair run's checkpoints are in {job.out}), then run the same command again: it resumes"
    return said


def _last_line(log: Path, start: int) -> str:
    """What the child said last: its own error line (``divergence train: error: ...``), else a full disk
    (``OSError: [Errno 28] No space left on device``: the cause, where rank 0 died of it and rank 1's
    "connection closed by peer" came last), else the log's last line, read from where the child
    began (lines before are an earlier attempt's)."""
    with open(log, "rb") as f:
        f.seek(start)
        lines = [line for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("divergence train: error:")]
    full = [line for line in lines if DISK_FULL in line]
    return (errors or full or lines or ["(no output)"])[-1]


def _log_path(job: PairJob) -> Path:
    return job.recipe_path.parent.parent / "logs" / f"{job.label}.log"


def device_type() -> str:
    """``cuda`` where a CUDA device is visible, else ``cpu``: where a study's pair runs train."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def parallel_jobs(flag: int | None, recipe_jobs, device: str, pairs: int) -> int:
    """Pair runs trained at once: ``--jobs``, else the recipe's ``jobs``, else (auto) 1 on a GPU and
    up to 2 on a CPU; never more than there are pair runs."""
    if flag is not None:
        if flag < 1:
            raise UserInputError(f"--jobs {flag}: must be >= 1")
        return min(flag, pairs)
    if recipe_jobs != "auto":
        return min(recipe_jobs, pairs)
    return 1 if device == "cuda" else max(1, min(2, (os.cpu_count() or 1), pairs))
