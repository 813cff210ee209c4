"""The parallel rows on real gloo ranks, and the reordering yardstick proven on known bugs.

One recipe, the tiny DiT (``model.denoiser=transformer``: a training step costs about a quarter of
the UNet's on a CPU) for 6 steps with a global batch of 4: a reordering reference R (2x2
accumulation vs one batch of 4, one process), the one-process arm b (1x4), and three 2-rank DDP
arms a (2x2), each pair a separate-job pair completed by ``divergence train`` (the comparator after
its arms): correct DDP, DDP with rank 1's gradient scaled by 1 + 1e-3 before the all-reduce, and DDP
with one parameter's gradient left out of the all-reduce, each arm a ``divergence train --arm a`` on the
2 ranks of the session's gloo spawn (``tests.scaleout.parallel_rows_runs``). A correct parallelization
differs from one process only by the order of fp32 sums, so it must read ``reordering_like`` against R;
each bug must read
``beyond_reordering`` (one replicate each: the point estimate decides), the rank scale on its
window and the unreduced parameter, whose difference grows unlike a reordering's, over the valid
steps (docs/method.md, "The reordering yardstick")"""

import json
import shutil

import pytest
import torch

from divergence.analysis.reordering import against_reordering
from divergence.cli import main
from divergence.report.inputs import load_pair
from divergence.pairfolder.arm.status import ArmStatus
from divergence.training.lockstep import train_pair
from divergence.training.separate_arm import train_arm
from tests.pairs.helpers import pair_recipe

from .parallel_rows_runs import ARMS_A, DDP, SHORT, command


@pytest.fixture(scope="session")  # session: built once on its xdist group's worker
def trained(tmp_path_factory, gloo_runs):
    root = tmp_path_factory.mktemp("parallel")
    reordering = ("arms.a=[{grad-accumulation: 2x2}]", "arms.b=[{grad-accumulation: 1x4}]")
    train_pair(pair_recipe("reordering", *SHORT, *reordering), root / "reordering")
    one = root / "one-process"
    train_arm(pair_recipe("data-parallel", *SHORT, ARMS_A["ddp"], *DDP), "b", one)  # one process
    for name in ARMS_A:  # each arm a from the gloo spawn; the same one-process arm b in every pair
        shutil.copytree(gloo_runs / "rows" / name, root / name)
        shutil.copytree(one / "b", root / name / "b")
    # each pair's command in this process: it finds both arms finished and runs the comparator alone
    for name in ARMS_A:
        assert main(command(name, root)) == 0, name
    return root


def test_each_arm_trains_as_its_own_job_and_the_comparator_completes_the_pair(trained):
    """With the two checks below on the same runs, in one test so the runs train once (xdist may split a
    module's tests over workers, each building the fixture)."""
    _each_arm_trains_as_its_own_job_and_the_comparator_completes_the_pair(trained)
    _correct_ddp_reads_reordering_like_and_each_injected_bug_reads_beyond_it(trained)
    _control_the_ddp_arm_starts_from_the_one_process_arms_weights(trained)


def _each_arm_trains_as_its_own_job_and_the_comparator_completes_the_pair(trained):
    """Every pair's arm a a 2-rank job of its own (on the gloo spawn's ranks), arm b one process, the
    comparator then completing each pair."""
    for name in ARMS_A:
        info = json.loads((trained / name / "pair.json").read_text())
        assert info["finished"] and info["last_step"] == 6, name
        assert ArmStatus.read(trained / name / "a").world_size == 2  # data-parallel 2x2 took: 2 gloo ranks
        assert ArmStatus.read(trained / name / "b").world_size == 1
        lines = [json.loads(x) for x in (trained / name / "costs.jsonl").read_text().splitlines()]
        assert [x["step"] for x in lines] == [1, 2, 3, 4, 5, 6]  # every step, per rank
        assert [len(x["arms"]["a"]["ranks"]) for x in lines] == [2] * 6 and len(lines[0]["arms"]["b"]["ranks"]) == 1
        assert all(x["arms"]["a"]["seconds"] > 0 for x in lines)


def _correct_ddp_reads_reordering_like_and_each_injected_bug_reads_beyond_it(trained):
    """Correct DDP reads ``reordering_like`` (on its window: its E equals the reordering's, log ratio
    0.0); each bug ``beyond_reordering``. Where it is read depends on the CPU's fp32 kernels, which
    are part of both pairs' arithmetic, so either way is checked for what it says. The rank scale's
    E grows as the reordering's does, a constant ratio: read on its window (measured on an AVX2
    CPU: +2.02 to +2.13 dex over steps 1-6, window 2-6, median +2.08; +2.34 on an AVX-512 one).
    The unreduced parameter's E adds up step by step: on the AVX2 CPU no window formed with the
    reordering's, and the ratio was read over the valid steps 1-6, above ``REORDERING_DEX`` at every
    one (+2.98 to +3.24 dex, growing, median +3.19); on the AVX-512 one a window formed (+3.42)."""
    from divergence.analysis.reordering import sentence

    reference = [load_pair(trained / "reordering")]
    readings = {name: against_reordering([load_pair(trained / name)], reference, []) for name in ARMS_A}
    said = {name: (r.status, r.read_on, round(r.ratio.mean, 2), r.reason) for name, r in readings.items()}
    assert readings["ddp"].status == "reordering_like", said
    assert readings["ddp"].fp32_equivalent  # data-parallel declares itself the identity in fp32
    for name in ("rank-scale", "unreduced-param"):
        r = readings[name]
        assert r.status == "beyond_reordering" and r.read_on in ("window", "valid_steps"), said
        assert r.fp32_equivalent  # the injected bug claims the identity, as the buggy DDP it stands for would
        said_by_verdict = sentence(r, name)
        assert said_by_verdict.endswith(f"if {name} should be the identity, look for a bug."), said_by_verdict
        valid_steps = "read over the valid steps 1-6, as X and R do not grow alike)" in said_by_verdict
        assert valid_steps == (r.read_on == "valid_steps"), said_by_verdict
        if r.read_on == "valid_steps":  # every valid step is read, and each is beyond the line
            assert r.estimates[0].window == (1, 6), said


def _control_the_ddp_arm_starts_from_the_one_process_arms_weights(trained):
    from safetensors.torch import load_file

    first = "step_000000.safetensors"
    a, b = (load_file(trained / "ddp" / arm / "checkpoints" / first) for arm in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
