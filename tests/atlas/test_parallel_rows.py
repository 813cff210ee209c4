"""The parallel atlas rows built here: where each trains, and the one line where it does not."""

from divergence.atlas.catalog import OPTIMIZATIONS, select
from pathlib import Path

from divergence.variants import VARIANTS

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_each_row_says_where_it_trains_and_why_not_elsewhere():
    tp, qat, offload = OPTIMIZATIONS["tensor-parallel"], OPTIMIZATIONS["int8-qat"], OPTIMIZATIONS["fsdp-offload"]
    assert tp.unavailable("cpu", "dit") is None and tp.unavailable("cpu", "unet").startswith("dit only")
    assert qat.unavailable("cpu", "unet") is None and qat.unavailable("cpu", "dit") is None
    assert offload.unavailable("cpu", "unet").startswith("GPU only") and offload.unavailable("cuda", "unet") is None
    assert "pip install --no-build-isolation deepspeed==0.19.8" in OPTIMIZATIONS["deepspeed-zero"].unavailable("cpu")
    assert "zero-1, fsdp-grad-op and fsdp-full" in OPTIMIZATIONS["deepspeed-zero"].needs
    assert "not built" in OPTIMIZATIONS["pipeline"].unavailable("cpu")
    assert "fsdp" not in [o.name for o in select(None)] and [o.name for o in select(["fsdp"])] == ["fsdp"]
    for name in ("fsdp-full", "fsdp-grad-op", "fsdp"):  # FSDP2 on gloo CPU ranks, both dense backbones
        assert (
            OPTIMIZATIONS[name].unavailable("cpu", "unet") is None
            and OPTIMIZATIONS[name].unavailable("cpu", "dit") is None
        )


def test_the_parallel_rows_are_fp32_reorderings_and_qat_is_not():
    assert VARIANTS["tensor-parallel"].fp32_equivalent and VARIANTS["fsdp-offload"].fp32_equivalent
    assert VARIANTS["fsdp"].fp32_equivalent and "GPU" not in VARIANTS["fsdp"].help.replace("GPUs", "")
    assert not VARIANTS["int8-qat"].fp32_equivalent


def test_the_fsdp_rows_shard_over_two_ranks_in_a_study_as_on_their_own(tmp_path):
    # a study rewrites every pair onto its own base and drops the pair file's recipe block: an atlas once
    # trained fsdp-full's arm a on one process of 16, so the 2 ranks of 8 now ride in the arms' variants
    from divergence.atlas.plan import backbone_study
    from divergence.study.runner import plan_jobs

    study = backbone_study("unet", select(["fsdp-full", "fsdp-grad-op"]), "cpu", ["replicates=1"]).study
    jobs = {j.label: j for j in plan_jobs(study, tmp_path, [])}
    for name, value, sharding in (("fsdp-full", "full", "FULL_SHARD"), ("fsdp-grad-op", "grad-op", "SHARD_GRAD_OP")):
        job = jobs[f"{name}-r0"]
        assert job.arm_cores == (2, 2) and job.config["arms"] == {
            "a": ["data-parallel=2x8", f"fsdp={value}"],
            "b": ["data-parallel=2x8"],
        }
        a, b = (job.config["recipes"][arm]["train"] for arm in "ab")
        assert (a["devices"], a["batch_size"], a["strategy"], a["fsdp_sharding"]) == (2, 8, "fsdp", sharding)
        assert (b["devices"], b["batch_size"], b["strategy"], b["fsdp_sharding"]) == (2, 8, "ddp", None)


def test_fsdp_refines_the_data_parallel_layout_only_after_it(tmp_path):
    from divergence.errors import RecipeError
    from divergence.variants.pair_recipe import load_pair_recipe

    pair = tmp_path / "pair.yaml"
    pair.write_text(
        "name: backwards\nbase: "
        + str(RECIPES / "tiny.yaml")
        + "\nrecipe: {sample: {enabled: false}}\narms:\n  a: [{fsdp: full}, {data-parallel: 2x8}]\n  b: [{data-parallel: 2x8}]\n"
    )
    try:
        load_pair_recipe(pair)
    except RecipeError as err:
        assert "arms.a[1]: sets train.strategy, which another variant of the same arm sets too" in str(err)
        assert "(fsdp and fsdp-offload may set it after another variant, not before)" in str(err)
    else:
        raise AssertionError("a layout after fsdp was taken")


def test_each_replicate_starts_its_multi_rank_pairs_first(tmp_path):
    # a job waits for room rather than being passed (study.runner.fits): a 2-rank pair planned between
    # 1-process ones left a core idle until the pair before it ended, once per 2-rank row and replicate
    from divergence.atlas.plan import backbone_study
    from divergence.study.runner import plan_jobs, start_order

    rows = select(["fused-adamw", "data-parallel", "zero-1", "fsdp-full"])
    planned = plan_jobs(backbone_study("unet", rows, "cpu", ["replicates=2"]).study, tmp_path, [])
    started = start_order(planned)
    assert sorted(map(id, started)) == sorted(map(id, planned))
    assert [j.replicate for j in started] == sorted(j.replicate for j in planned)
    for replicate in (0, 1):
        jobs = [j for j in started if j.replicate == replicate]
        assert {j.pair.name for j in jobs[:3]} == {"data-parallel", "zero-1", "fsdp-full"}
        assert [j.cores_now() for j in jobs] == [2, 2, 2] + [1] * (len(jobs) - 3)
        assert jobs[2].pair.name == "data-parallel"  # arms of 2 and 1 ranks: its arm b runs beside a 1-process pair
        ones = [j.label for j in jobs[3:]]
        assert ones == [j.label for j in planned if j.replicate == replicate and j.cores == 1]


def test_a_two_thread_cpu_arm_takes_two_slots_and_starts_with_the_two_rank_pairs(tmp_path):
    # beside another pair's job on 2 cores, the cpu-threads row's 2-thread arm shared a core: its steps
    # read 2.1x slower than 1 thread (the first CPU atlas), and the neighbour slowed down with it
    from divergence.atlas.plan import backbone_study
    from divergence.study.runner import fits, plan_jobs, start_order

    planned = plan_jobs(backbone_study("unet", select(["cpu-threads"]), "cpu", ["replicates=1"]).study, tmp_path, [])
    jobs = {j.label: j for j in planned}
    threads = jobs["cpu-threads-r0"]
    assert threads.cores == 2 and threads.arm_cores == ()  # lockstep: both arms in one process, 2 cores throughout
    assert {label: j.cores for label, j in jobs.items() if label != "cpu-threads-r0"} == dict.fromkeys(
        ["seed-vs-seed-r0", "bf16-vs-fp32-r0", "control-r0", "reordering-r0"], 1
    )
    assert not fits(threads, [jobs["control-r0"]], 2) and not fits(jobs["control-r0"], [threads], 2)
    assert fits(threads, [], 2)
    assert start_order(planned)[0] is threads
