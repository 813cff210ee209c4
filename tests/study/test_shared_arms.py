"""Every arm of a study trained once: the plan, and the same stores bit for bit as pair by pair."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from divergence.cli import main
from divergence.errors import UserInputError
from divergence.pairfolder.arm.status import ArmStatus
from divergence.study import load_study, shared_arms
from divergence.study.runner import plan_jobs, start_order

from .test_study import TINY

# the tiny study (2 replicates of 4 steps), trained pair by pair once for the study tests (``tiny_study``), and
# its replicate 0 trained again with shared arms (replicate r's arms are seeded by r, not by the count). Arm-steps
# of replicate 0: 5 pair runs of 2 arms of 4 steps pair by pair (40); shared, 6 distinct arms (flash's two, the
# seed pair's two, the control's arm b, the reordering's arm a: its arm b, one batch of 2, is the seed pair's
# arm a) of 4 steps (24).
STUDY = [*TINY, "--replicates", "1"]


def _planned(tmp_path, *overrides):
    study = load_study(Path(shared_arms.__file__).parents[1] / "recipes" / "study.yaml", list(overrides))
    return start_order(plan_jobs(study, tmp_path, []))


def test_the_default_study_trains_its_shared_arms_once(tmp_path):
    jobs = _planned(tmp_path)
    record = shared_arms.assign(jobs, tmp_path)
    steps = record["arm_steps"]
    assert steps["pair_by_pair"] == 50 * 30  # 6 replicates of 4 pairs and the control once, 2 arms of 30 steps
    assert steps["trained"] <= 0.65 * steps["pair_by_pair"]
    assert steps["trained"] == 31 * 30  # per replicate 5 distinct arms, and the control's second training
    order = [job.label for job in jobs]
    for job in jobs:
        if job.pair.role == "study":
            assert not job.borrowed and job.lends  # measured as pair by pair (coherence, side-by-side step times)
        if job.pair.role == "control":
            assert set(job.borrowed) == {"a"}  # arm b: a second training of the recipe, never arm a itself
        for arm, owner in job.borrowed.items():
            owner_label = f"{owner.parent.parent.name}-{owner.parent.name}"
            assert order.index(owner_label) < order.index(job.label)  # the owner starts first
            owner_job = jobs[order.index(owner_label)]
            assert owner_job.lends and owner_job.replicate == job.replicate
            assert job.sharing["keys"]["ab".index(arm)] == owner_job.sharing["keys"]["ab".index(owner.name)]
    assert json.loads((tmp_path / "arms.json").read_text())["arm_steps"] == steps


def test_a_comparator_that_follows_a_lenders_arm_keeps_no_slot(tmp_path):
    """A borrowing pair whose own arm has finished only follows the lender's arm: it holds no core, so
    another pair trains beside the lender; once the lender's arm is done it catches up on one."""
    from divergence.study.runner import FOLLOWERS_PER_CORE, fits

    jobs = _planned(tmp_path, "replicates=1")
    shared_arms.assign(jobs, tmp_path)
    borrower = next(j for j in jobs if j.borrowed and len(j.borrowed) < 2 and j.arm_cores)
    ((borrowed, owner),) = borrower.borrowed.items()
    own = "b" if borrowed == "a" else "a"
    lender = next(j for j in jobs if j.out == owner.parent)
    others = [j for j in jobs if j not in (borrower, lender)]

    def status(folder, state, step):
        folder.mkdir(parents=True, exist_ok=True)
        ArmStatus(folder.name, state=state, last_step=step, max_steps=borrower.max_steps).write(folder)

    assert borrower.cores_now() == 1  # its own arm to train, whatever the lender does
    status(borrower.out / own, "finished", borrower.max_steps)
    status(owner, "running", 3)
    assert borrower.following() and borrower.cores_now() == 0
    assert fits(others[0], [lender, borrower], 2)  # the follower leaves its slot to a training pair
    assert not fits(others[0], [lender, borrower, *others[1 : 2 * FOLLOWERS_PER_CORE]], 2)  # a cap on processes
    status(owner, "finished", borrower.max_steps)
    assert not borrower.following() and borrower.cores_now() == 1  # now it compares the rest: one core


def test_a_study_folder_keeps_the_plan_it_started_with(tmp_path):
    jobs = _planned(tmp_path, "replicates=1")
    shared_arms.assign(jobs, tmp_path)
    with pytest.raises(UserInputError, match="shares arms between pairs; run it again without --no-shared-arms"):
        shared_arms.record_pair_by_pair(jobs, tmp_path / "")
    other = tmp_path / "other"
    other.mkdir()
    shared_arms.record_pair_by_pair(jobs, other)
    with pytest.raises(UserInputError, match="trains pair by pair; run it again with --no-shared-arms"):
        shared_arms.assign(jobs, other)
    (tmp_path / "arms.json").write_text('{"runs": {"x": {"borrowed": 3}}}')
    with pytest.raises(UserInputError, match=r"arms.json: not an arms.json written by divergence study"):
        shared_arms.assign(jobs, tmp_path)


def test_a_study_trained_pair_by_pair_is_not_shared_by_a_second_run(tmp_path):
    jobs = _planned(tmp_path / "s", "replicates=1")
    (jobs[0].out / "a").mkdir(parents=True)  # a pair run started before the study planned shared arms
    with pytest.raises(UserInputError, match="trained pair by pair .*--no-shared-arms"):
        shared_arms.assign(jobs, tmp_path / "s")


def _stores(out: Path) -> dict:
    """Replicate 0's pair runs' stores, by folder."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.glob("*/r0/metrics.jsonl"))}


def _pairs(out: Path) -> str:
    """summary.json's entries of replicate 0's pair runs (growth rates, trajectories, ...), folders aside."""
    pairs = json.loads((out / "summary.json").read_text())["pairs"]
    return json.dumps({k: {**v, "folder": None} for k, v in pairs.items() if v["replicate"] == 0}, sort_keys=True)


def _kill_mid_run(out: Path) -> None:
    """``divergence study`` in its own session, SIGKILLed with its children once a shared arm's journal has
    two steps and before the study finished (a machine lost mid-run)."""
    env = {**os.environ, "WANDB_MODE": "offline"}
    command = [sys.executable, "-m", "divergence", "study", "--out", str(out), *STUDY]
    process = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    losses = out / "seed-vs-seed" / "r0" / "a" / "losses.jsonl"
    while time.monotonic() < deadline and process.poll() is None:
        if losses.is_file() and len(losses.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    assert process.poll() is None, "the study ended before it could be killed"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def test_shared_arms_give_the_pair_by_pair_stores_bit_for_bit_even_after_a_sigkill(tiny_study, tmp_path, capsys):
    """Replicate 0 of the same study in both plans: pair by pair (``tiny_study``: ``--no-shared-arms``, the
    study tests' one trained study), and with shared arms, SIGKILLed mid-run and started again."""
    by_pair = tiny_study.out
    assert tiny_study.code == 0
    shared = tmp_path / "shared"
    _kill_mid_run(shared)
    assert main(["study", "--out", str(shared), *STUDY]) == 0
    assert "arm-steps: 24 trained, 40 pair by pair (0.60x" in capsys.readouterr().err
    assert _stores(shared) == _stores(by_pair) and len(_stores(shared)) == 5
    assert _pairs(shared) == _pairs(by_pair)
    record = json.loads((shared / "arms.json").read_text())
    assert record["shared"] and record["arm_steps"] == {"trained": 24, "pair_by_pair": 40}
    assert json.loads((by_pair / "arms.json").read_text())["arm_steps"] == {"trained": 72, "pair_by_pair": 72}
    trained = [arm for arm in shared.glob("*/r*/[ab]") if not arm.is_symlink()]
    assert len(trained) * 4 == 24  # every distinct arm one folder, each trained 4 steps
    for arm in trained:  # no step lost, none trained twice: a killed arm resumed once, after its checkpoint
        steps = [json.loads(line)["step"] for line in (arm / "losses.jsonl").read_text().splitlines()]
        assert steps == [1, 2, 3, 4], arm
        status = ArmStatus.read(arm)
        assert status.finished and status.attempt <= 2
    assert (shared / "bf16-vs-fp32" / "r0" / "a").resolve() == (shared / "flash-vs-baseline" / "r0" / "b").resolve()
    # a separate-job pair borrows too: the reordering's arm b (1x2) is the seed pair's arm a (seed 0, batch 2)
    assert (shared / "reordering" / "r0" / "b").resolve() == (shared / "seed-vs-seed" / "r0" / "a").resolve()
    summary = json.loads((shared / "summary.json").read_text())
    assert summary["arm_steps"] == {"trained": 24, "pair_by_pair": 40}
    assert "Cost: 24 arm-steps trained (0.60x the 40 a pair-by-pair plan trains" in (shared / "report.md").read_text()
    assert "Cost: 72 arm-steps trained (1.00x" in (by_pair / "report.md").read_text()
    borrowing = shared / "bf16-vs-fp32" / "r0"  # both its arms links: `watch` reads it as any finished pair
    store = (borrowing / "metrics.jsonl").read_bytes()
    assert main(["watch", str(borrowing), "--timeout", "5", "--quiet", "--no-wandb"]) == 0
    assert (borrowing / "metrics.jsonl").read_bytes() == store
    attempts = {arm: ArmStatus.read(arm).attempt for arm in trained}
    assert main(["study", "--out", str(shared), *STUDY]) == 0  # finished: trains nothing
    assert {arm: ArmStatus.read(arm).attempt for arm in trained} == attempts


def test_a_pair_that_only_compares_waits_for_its_owners_and_lets_later_jobs_pass(tmp_path):
    from divergence.pairfolder.arm.status import ArmStatus as Status
    from divergence.study.runner import PairJob, next_ready

    owner = tmp_path / "seed-vs-seed" / "r0"
    compare_only = PairJob(None, None, tmp_path / "bf16-vs-fp32" / "r0", 4, borrowed={a: owner / a for a in "ab"})
    trains = PairJob(None, None, tmp_path / "control" / "r0", 4, borrowed={"a": owner / "a"})
    running = [PairJob(None, None, owner, 4)]
    assert next_ready([compare_only, trains], running) is trains  # its own arm b trains meanwhile
    assert next_ready([compare_only], []) is compare_only  # nothing else to run: it starts and waits
    for arm in "ab":
        (owner / arm).mkdir(parents=True)
        Status(arm, state="finished", last_step=4).write(owner / arm)
    assert next_ready([compare_only, trains], running) is compare_only


def test_a_later_run_of_a_subset_finds_the_owners_the_first_recorded(tmp_path):
    """The atlas trains its first look, then more replicates of some rows and the references: a reference
    recorded in the first run borrows from a row the second run does not train again."""
    jobs = _planned(tmp_path, "replicates=1")
    shared_arms.assign(jobs, tmp_path)
    borrowers = [job for job in jobs if job.borrowed]
    first = {job.label: dict(job.borrowed) for job in borrowers}
    later = _planned(tmp_path, "replicates=1")
    subset = [job for job in later if not job.lends]  # the owners are not in this run
    shared_arms.assign(subset, tmp_path)
    assert {job.label: job.borrowed for job in subset if job.borrowed} == first
