"""The study: recipe resolution, its errors, and a tiny study end to end (train, resume, report)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from divergence.cli import main
from divergence.errors import RecipeError
from divergence.study import load_study

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
QUICK = [
    "--max-steps",
    "4",
    "--no-wandb",
    "--quiet",
    "tracking.every=1",
    "tracking.probe.size=4",
    "train.batch_size=2",
    "sample.enabled=false",
    "tracking.coherence_every=0",  # the pairs' C(T) (one more step each 3): tests/pairs/test_coherence_record.py
    "log.wandb=false",  # each arm's offline wandb run (~2.4 s of CPU a child): tests/loggers
    "data.resolution=16",  # 8x8 patches, not 16x16: a pair step ~2x cheaper, the study's mechanics the same
]
# the study's mechanics, not a backbone's: the DiT trains ~3x faster than the UNet (the default study's
# resolution onto the UNet base: test_default_study_resolves_every_pair_onto_one_base)
DIT = ["base=tiny-dit.yaml"]
# the reordering reference at the tiny study's batch of 2: 2 micro-batches of 1 against one batch of 2, the
# shipped pair's arms (4x4 against 1x16) scaled down as train.batch_size=2 scales the others. The shipped arms
# train 8x the examples of every other arm, in two more processes; and as in the default study at full size
# (1x16 is its base's batch), arm b is then the fp32 baseline arm the seed pair trains, borrowed with shared arms
REORDERING = (
    "references.reordering={name: reordering, arms: {a: [{grad-accumulation: 2x1}], b: [{grad-accumulation: 1x2}]}}"
)
# the tiny study: the default study's five pairs on the DiT, 2 replicates of 4 steps, two pair runs side by
# side; trained once pair by pair (``tiny_study``, tests/study/conftest.py) and once with shared arms
# (test_shared_arms), whose stores must be the same bytes
TINY = ["--jobs", "2", "--replicates", "2", *QUICK, *DIT, REORDERING]


def test_default_study_resolves_every_pair_onto_one_base():
    study = load_study(RECIPES / "study.yaml", device_type="cpu")
    assert [(p.role, p.name) for p in study.pairs] == [
        ("study", "flash-vs-baseline"),
        ("seed", "seed-vs-seed"),
        ("precision", "bf16-vs-fp32"),
        ("control", "control"),
        ("reordering", "reordering"),
    ]
    assert len({p.recipe["base"] for p in study.pairs}) == 1
    assert len({p.recipe["recipe"]["train"]["max_steps"] for p in study.pairs}) == 1 and study.replicates >= 3
    assert "stand-in" in study.pairs[2].recipe["description"] and study.pairs[2].note


def test_precision_auto_is_the_papers_fp16_pair_on_a_gpu():
    study = load_study(RECIPES / "study.yaml", device_type="cuda")
    assert study.pairs[2].name == "fp16-vs-fp32" and not study.pairs[2].note


def test_precision_auto_from_a_recipe_outside_recipes_is_the_shipped_pair(tmp_path):
    """A copy of study.yaml in a folder of one's own (absolute base and study): auto still resolves."""
    path = tmp_path / "mine.yaml"
    path.write_text(
        f"base: {RECIPES}/tiny.yaml\nstudy: {RECIPES}/pairs/fused-adamw.yaml\nreferences: {{precision: auto}}\n"
    )
    study = load_study(path)
    assert [p.name for p in study.pairs] == ["fused-adamw", "bf16-vs-fp32"]


def test_inline_study_pair_and_overrides():
    study = load_study(RECIPES / "study.yaml", ["study=pairs/fused-adamw.yaml", "references.control=null"])
    assert [p.name for p in study.pairs] == ["fused-adamw", "seed-vs-seed", "bf16-vs-fp32", "reordering"]


@pytest.mark.parametrize(
    "text,message",
    [
        ("base: {r}/tiny.yaml\nflavour: 1\nstudy: {r}/pairs/control.yaml", "unknown key 'flavour'"),
        ("study: {r}/pairs/control.yaml", "missing key 'base'"),
        ("base: {r}/nowhere.yaml\nstudy: {r}/pairs/control.yaml", "base:"),
        ("base: {r}/tiny.yaml\nstudy: {r}/pairs/nothing.yaml", "study:"),
        ("base: {r}/tiny.yaml\nstudy: 3", "expected a pair recipe file"),
        ("base: {r}/tiny.yaml\nstudy: {r}/pairs/control.yaml\nreferences: {{noise: x}}", "references"),
        ("base: {r}/tiny.yaml\nstudy: {r}/pairs/control.yaml\njobs: 0", "jobs"),
        ("base: {r}/tiny.yaml\nstudy: {r}/pairs/control.yaml\nreplicates: 0", "replicates: expected a positive"),
        (
            "base: {r}/tiny.yaml\nstudy: {r}/pairs/seed-vs-seed.yaml\nreferences: {{seed: {r}/pairs/seed-vs-seed.yaml}}",
            "two pairs share a name",
        ),
    ],
)
def test_bad_study_recipes(tmp_path, text, message):
    path = tmp_path / "study.yaml"
    path.write_text(text.format(r=RECIPES))
    with pytest.raises(RecipeError) as err:
        load_study(path)
    assert message in str(err.value)


def test_references_reordering_is_a_reordering_pair_trained_in_the_base_numerics_with_replicates(tmp_path):
    from divergence.study.runner import plan_jobs, write_recipes
    from divergence.variants.pair_recipe import load_pair_recipe

    study = load_study(RECIPES / "study.yaml", ["replicates=2"])
    (pair,) = [p for p in study.pairs if p.role == "reordering"]
    assert (pair.key, pair.file, pair.recipe["reordering"], pair.single) == (
        "references.reordering",
        "pairs/reordering.yaml",
        True,
        False,
    )
    jobs = [j for j in plan_jobs(study, tmp_path, ["train.max_steps=2"]) if j.pair.role == "reordering"]
    write_recipes(jobs)
    recipes = [load_pair_recipe(j.recipe_path) for j in jobs]
    assert [r.replicate for r in recipes] == [0, 1] and {r.category for r in recipes} == {"reordering"}
    assert {r.base.train.precision for r in recipes} == {"32-true"}  # the base's numerics, not flash's bf16
    # any pair file of fp32-equivalent arms serves, declared a reordering by the study whatever it says
    other = load_study(RECIPES / "study.yaml", ["references.reordering=pairs/fused-adamw.yaml"])
    assert [p.recipe["reordering"] for p in other.pairs if p.role == "reordering"] == [True]
    assert "reordering" in {p.name for p in load_study(RECIPES / "study-dit.yaml").pairs}


@pytest.mark.parametrize(
    "value, says",
    [
        (
            "pairs/fp16-vs-fp32.yaml",
            "references.reordering (pairs/fp16-vs-fp32.yaml): arms.a[0]: precision=16-mixed "
            "is not an fp32-equivalent transformation",
        ),
        ("pairs/nowhere.yaml", "references.reordering: "),
        ("3", "references.reordering: expected a pair recipe file"),
    ],
)
def test_a_bad_references_reordering_is_one_line_and_exit_2_before_training(tmp_path, capsys, value, says):
    code = main(["study", "--out", str(tmp_path / "s"), *QUICK, f"references.reordering={value}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert not list((tmp_path / "s").glob("*/*/metrics.jsonl"))


@pytest.mark.parametrize(
    "extra, says",
    [  # the pair under study in its deployment numerics kept where the recipe gives it (was "study.yaml: .tracking")
        (
            ["tracking.coherence_every=-1"],
            "study.yaml: study (pairs/flash-vs-baseline.yaml): tracking.coherence_every: must be >= 0",
        ),
        (["train.lr=-1"], "study.yaml: study (pairs/flash-vs-baseline.yaml): train.lr: must be in (0, 1]"),
        ([".tracking.coherence_every=1"], "override '.tracking.coherence_every=1': the key has an empty part"),
        (["tracking.=1"], "override 'tracking.=1': the key has an empty part"),
    ],
)
def test_a_bad_key_in_a_study_is_named_as_its_recipe_gives_it(tmp_path, capsys, extra, says):
    code = main(["study", "--out", str(tmp_path / "s"), *QUICK, *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert ": ." not in err and ": :" not in err


def test_a_control_pair_named_as_the_reordering_reference_is_refused_saying_why(tmp_path, capsys):
    """``references.reordering=pairs/control.yaml``: a control (identical arms) is no reordering yardstick;
    said as that, not as two pairs sharing a name."""
    code = main(["study", "--out", str(tmp_path / "s"), *QUICK, "references.reordering=pairs/control.yaml"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "references.reordering (pairs/control.yaml): a control pair" in err and "pairs/reordering.yaml" in err
    assert "share a name" not in err


def test_tiny_study_end_to_end_then_resume_skips_finished_pairs(tiny_study, tmp_path, capsys):
    """The tiny study end to end, then the checks that read the same trained study, in one test so that
    the study trains once (xdist may split a module's tests over workers, each building the fixture)."""
    _end_to_end(tiny_study)
    _the_same_replicate_with_jobs_1_and_2_and_a_study_extended_trains_only_new_replicates(tiny_study, tmp_path, capsys)


def _end_to_end(tiny_study):
    out, printed = tiny_study.out, tiny_study.printed
    assert tiny_study.code == 0
    assert "flash attention" in printed and "report:" in printed
    summary = json.loads((out / "summary.json").read_text())
    names = {"flash-vs-baseline", "seed-vs-seed", "bf16-vs-fp32", "control", "reordering"}
    replicated = names - {"control"}  # the control trained once, never replicated
    assert set(summary["pairs"]) == names | {f"{name}#1" for name in replicated}
    assert summary["verdicts"][0]["study"] == "flash-vs-baseline"
    assert summary["pairs"]["reordering"]["category"] == "reordering"
    assert summary["verdicts"][0]["reordering"]["reference"] == "reordering"
    assert (out / "report.html").is_file() and list((out / "figures").glob("*.png"))
    for name in names:
        for replicate in (0, 1) if name in replicated else (0,):
            info = json.loads((out / name / f"r{replicate}" / "pair.json").read_text())
            assert info["finished"] and info["last_step"] == 4 and info["replicate"] == replicate
            assert info["tracking"]["probe"]["size"] == 4 and info["tracking"]["dense"] == [[20, 1], [100, 5]]


def test_replicates_lay_out_one_folder_per_pair_and_replicate(tmp_path):
    from divergence.study.runner import plan_jobs, write_recipes

    study = load_study(RECIPES / "study.yaml", ["replicates=3"])
    jobs = plan_jobs(study, tmp_path, ["train.max_steps=2"])
    write_recipes(jobs)
    runs = sorted(str(j.out.relative_to(tmp_path)) for j in jobs)
    assert runs == sorted(
        [
            f"{name}/r{r}"
            for name in ("flash-vs-baseline", "seed-vs-seed", "bf16-vs-fp32", "reordering")
            for r in range(3)
        ]
        + ["control/r0"]
    )
    assert len({j.recipe_path for j in jobs}) == len(jobs) == 13
    from divergence.variants.pair_recipe import load_pair_recipe

    seeds = {(j.pair.name, j.replicate): load_pair_recipe(j.recipe_path).arm_recipes["a"].data.seed for j in jobs}
    assert seeds[("flash-vs-baseline", 2)] == seeds[("bf16-vs-fp32", 2)] != seeds[("flash-vs-baseline", 1)]


def test_a_bad_override_fails_before_any_training(tmp_path, capsys):
    code = main(["study", "--out", str(tmp_path / "s"), *QUICK, "train.lr=-1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "train.lr" in err
    assert not list((tmp_path / "s").glob("*/*/metrics.jsonl"))


def _the_same_replicate_with_jobs_1_and_2_and_a_study_extended_trains_only_new_replicates(tiny_study, tmp_path, capsys):
    # flash alone (--jobs 1), and side by side with the other pairs (--jobs 2: the tiny study); the thread count is the recipe's (train.cpu_threads), not --jobs' (before: 2 threads with
    # --jobs 1 on a 2-core machine and 1 with --jobs 2, and the stores differed from step 1)
    def only(replicates):
        return [
            "--jobs",
            "1",
            "--replicates",
            str(replicates),
            *QUICK,
            "references.seed=null",
            "references.precision=null",
            "references.reordering=null",
            "references.control=null",  # trained once, never replicated: test_replicates_lay_out_one_folder_...
            *DIT,
        ]

    one, two = tmp_path / "jobs1", tiny_study.out
    assert main(["study", "--out", str(one), *only(1)]) == 0
    run = Path("flash-vs-baseline") / "r0"
    assert (one / run / "metrics.jsonl").read_bytes() == (two / run / "metrics.jsonl").read_bytes()
    for study in (one, two):
        numerics = json.loads((study / run / "pair.json").read_text())["numerics"]
        assert numerics["a"]["cpu_threads"] == numerics["b"]["cpu_threads"] == 1

    # over the study of one pair (its report ~3x cheaper to rebuild than the tiny study's five pairs)
    stamps = {p: p.stat().st_mtime_ns for p in sorted(one.glob("*/r*/metrics.jsonl"))}
    capsys.readouterr()
    _a_re_run_with_an_edited_recipe_is_refused_not_mixed(one, [*only(2), "train.lr=0.5"], capsys)
    # the same recipe after the refusal: reused, nothing to train
    assert main(["study", "--out", str(one), *only(1)]) == 0
    assert stamps == {p: p.stat().st_mtime_ns for p in sorted(one.glob("*/r*/metrics.jsonl"))} and stamps

    first = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(one.glob("*/r*/metrics.jsonl"))}
    logs = {p: p.stat().st_size for p in sorted((one / "logs").glob("*.log"))}
    assert main(["study", "--out", str(one), *only(2)]) == 0
    assert {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in first} == first  # replicate 0: not touched
    assert {p: p.stat().st_size for p in logs} == logs
    runs = sorted(str(p.parent.relative_to(one)) for p in one.glob("*/r*/metrics.jsonl"))
    assert runs == ["flash-vs-baseline/r0", "flash-vs-baseline/r1"]
    capsys.readouterr()

    # a resume in another thread count is refused in one line, before anything trains
    code = main(
        [
            "train",
            "--recipe",
            str(one / "recipes" / "flash-vs-baseline-r0.yaml"),
            "--out",
            str(one / run),
            *QUICK[4:],
            "train.max_steps=9",
            "train.cpu_threads=2",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "train.cpu_threads = 1, this command 2" in err


def _a_re_run_with_an_edited_recipe_is_refused_not_mixed(out, edited, capsys):
    """A re-run with ``train.lr=0.5`` over runs of ``train.lr=0.0003`` (the base's) exited 0 with a
    report of the old runs, and one extended by a replicate mixed old and new; now one line naming the run and
    the key. ``edited``: the study's arguments, two replicates and ``train.lr=0.5``."""
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.suffix != ".lock"}
    assert main(["study", "--out", str(out), *edited]) == 2
    err = capsys.readouterr().err.strip()
    run = out / "flash-vs-baseline" / "r0"
    assert len(err.splitlines()) == 1 and f"{run}: its pair.yaml" in err, err
    assert "recipes.a.train.lr = 0.0003, this command 0.5" in err and "give a new --out, or delete" in err
    assert {p: p.read_bytes() for p in before} == before  # runs, recipes and report untouched
    assert not (out / "flash-vs-baseline" / "r1").exists()  # no run of the new recipe beside the old


def test_a_failed_train_child_is_quoted_from_its_own_lines(tmp_path):
    """The study quoted the log's last line, which an orphaned ``train`` of an earlier study (or
    an earlier attempt) wrote; now the child's own error line, from where it began writing."""
    from divergence.study.runner import _last_line

    log = tmp_path / "pair-r0.log"
    log.write_text("divergence train: error: an earlier attempt's\n")
    start = log.stat().st_size
    with open(log, "a") as f:
        f.write("Epoch 0: step 3\ndivergence train: error: this child's own\nEpoch 0: step 4 (the orphan)\n")
    assert _last_line(log, start) == "divergence train: error: this child's own"
    with open(log, "a") as f:
        start = f.tell()
        f.write("Traceback (most recent call last):\nValueError: boom\n\n")
    assert _last_line(log, start) == "ValueError: boom"
    assert _last_line(log, log.stat().st_size) == "(no output)"


def test_a_full_disk_is_said_as_the_cause_with_what_to_do_and_not_restarted(tmp_path):
    # the CPU atlas's DiT data-parallel arm: rank 0 died of ENOSPC while saving its checkpoint, rank 1's
    # gloo error came last, and the restart failed the same way; the study quoted rank 1's line
    from divergence.study.runner import PairJob, _failure, _log_path, _restarts

    job = PairJob(
        SimpleNamespace(name="data-parallel"), tmp_path / "recipes" / "data-parallel-r1.yaml", tmp_path / "run", 30
    )
    job.replicate, job.process = 1, SimpleNamespace(returncode=1)
    log = _log_path(job)
    log.parent.mkdir(parents=True)
    log.write_text(
        "Epoch 0: step 7\nOSError: [Errno 28] No space left on device\n"
        "[rank1]: RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1187.\n"
    )
    said = _failure(job)
    assert "failed (exit 1): OSError: [Errno 28] No space left on device [full log: " in said, said
    assert said.endswith(
        f"free disk space (a pair run's checkpoints are in {tmp_path / 'run'}), then run the same command again: it resumes"
    )
    assert not _restarts(job) and job.restarts == 0
    log.write_text("[rank1]: RuntimeError: Connection closed by peer\n")  # any other failure: one restart
    assert _restarts(job) and job.restarts == 1
