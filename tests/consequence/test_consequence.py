"""``divergence consequence``: the whole chain on a 2-dose, 1-replicate, 8-step version, its resume, its
recipe's errors."""

import json
import os
import time
from pathlib import Path

import pytest
import torch
import yaml

from divergence.cli import main
from divergence.data.shape_check import parse_caption

RECIPES = Path(__file__).resolve().parents[2] / "divergence" / "recipes"
# the chain's mechanics, not a converged model: the DiT at 16x16 (8x8 patches) trains ~3x faster than the
# UNet; 2 doses, 1 replicate of 8 steps; 4 captions, 2 sampling seeds, 2 sampler steps
TINY = [
    "--max-steps",
    "8",
    "--replicates",
    "1",
    "--jobs",
    "2",
    "--quiet",
    "--no-wandb",
    "base=tiny-dit.yaml",
    "doses=[1.0e-3,1.0e-1]",
    "rows=[]",
    "early=[1,8]",
    "score.captions=4",
    "score.seeds=2",
    "score.steps=2",
    "train.batch_size=2",
    "tracking.probe.size=2",
    "log.csv=false",
    "data.resolution=16",
    "train.checkpoint_every=4",
    "train.warmup_steps=0",  # the shipped 20 warm-up steps would outlast the 8 steps
]
REFERENCES = {"seed": str(RECIPES / "pairs/seed-vs-seed.yaml"), "precision": str(RECIPES / "pairs/bf16-vs-fp32.yaml")}
PAIRS = {"grad-noise-0.001", "grad-noise-0.1", "seed-vs-seed", "bf16-vs-fp32"}


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """One consequence run, trained and scored once for the module's tests."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("consequence") / "c"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["consequence", "--out", str(out), *TINY])
    return out, code, printed.getvalue()


def test_the_chain_writes_every_pair_run_its_early_dose_scores_and_the_curve(chain):
    out, code, printed = chain
    assert code == 0, printed
    result = json.loads((out / "consequence.json").read_text())
    runs = {r["pair"]: r for r in result["runs"]}
    assert set(runs) == PAIRS and all(r["replicate"] == 0 and r["step"] == 8 for r in runs.values())
    assert {p: (runs[p]["role"], runs[p]["reference"], runs[p]["eps"]) for p in PAIRS} == {
        "grad-noise-0.001": ("ladder", None, 0.001),
        "grad-noise-0.1": ("ladder", None, 0.1),
        "seed-vs-seed": ("reference", "seed", None),
        "bf16-vs-fp32": ("reference", "precision", None),
    }
    # the early dose: the study's statistic vs bf16, larger for the larger dose; P at 0; none for the seed pair
    assert runs["grad-noise-0.001"]["early_dex"] < runs["grad-noise-0.1"]["early_dex"] < 0
    assert runs["bf16-vs-fp32"]["early_dex"] == 0.0 and runs["seed-vs-seed"]["early_dex"] is None
    for r in runs.values():
        shift = r["score_shift"]
        assert shift["lo"] <= shift["value"] <= shift["hi"]
        assert shift["value"] == pytest.approx(r["score_a"] - r["score_b"])
        assert r["probe_source"] == "probe" and r["probe_shift"] is not None
        assert r["score_a_interval"][0] <= r["score_a"] <= r["score_a_interval"][1]
        distance = r["sample_distance"]  # both arms' kept images, from the same noises
        assert distance["images"] == 4 and distance["lo"] <= distance["value"] <= distance["hi"]
    assert runs["seed-vs-seed"]["sample_distance"]["value"] > 0
    assert result["sample_distance"]["seed"] == runs["seed-vs-seed"]["sample_distance"]["value"]
    assert "distance" in result["spearman"]
    assert result["seed_margin"]["probe"]["value"] == pytest.approx(abs(runs["seed-vs-seed"]["probe_shift"]))
    assert [rung["eps"] for rung in result["ladder"]] == [0.001, 0.1]
    assert "Measured on this recipe only (consequence, 8 steps)" in result["sentence"]
    assert result["precision_reference"] == "bf16-vs-fp32" and "dex vs bf16-vs-fp32" in result["sentence"]
    assert result["sentence"] in printed and (out / "consequence.png").stat().st_size > 10_000
    assert "scored 5 arm(s), 3 read back from score.json" in printed  # 8 arms of 4 pair runs, 5 trainings
    # scored in 2 processes: the 5 trainings' last weights and the seed pair's earlier ones (0 and 4 of each arm)
    assert "scoring 9 arm weights file(s), 2 at a time" in printed
    # the seed pair's two arms over training: their weights files at 4 and 8 (and 0 where kept) scored
    converged = result["convergence"]
    assert converged["score"]["arms"] == 2 and converged["score"]["steps"][-2:] == [4, 8]
    assert (out / "seed-vs-seed" / "r0" / "a" / "scores" / "step_000004.json").is_file()
    assert converged["probe"]["arms"] == 2 and converged["probe"]["steps"][-1] == 8
    assert converged["sentence"] in printed and "Convergence, from the seed pair's arms over their 8 steps" in printed


def test_an_arm_shared_between_pair_runs_is_scored_once_into_its_owner(chain):
    out, _, _ = chain
    borrowed = out / "grad-noise-0.1" / "r0" / "b"  # the fp32 baseline arm, trained by another pair run
    assert borrowed.is_symlink() and (borrowed / "score.json").is_file()
    scores = sorted(out.glob("*/r0/*/score.json"))
    real = {p.resolve() for p in scores}
    assert len(scores) == 8 and len(real) == 5
    record = json.loads((borrowed / "score.json").read_text())
    assert record["step"] == 8 and record["settings"]["seeds"] == [0, 1] and len(record["hits"]["all"]) == 2
    assert len(record["settings"]["captions"]) == 4 and len(record["hits"]["all"][0]) == 4


def test_the_sample_grids_show_the_scored_images_and_a_lost_file_draws_the_same_again(chain):
    """Each scored arm keeps its first seed's images; a lost samples file is drawn again from the same
    noises, so the report shows the very images the score read."""
    from divergence.study.consequence import load_consequence
    from divergence.study.consequence_runs import SAMPLES_FILE, arm_samples

    out, _, _ = chain
    assert (out / "consequence-samples.png").stat().st_size > 5_000
    arm = out / "seed-vs-seed" / "r0" / "a"
    kept = arm_samples(arm.parent, "a", 8, _settings(load_consequence))
    assert kept.shape == (4, 16, 16, 3) and kept.dtype == torch.uint8
    (arm / SAMPLES_FILE).unlink()
    again = arm_samples(arm.parent, "a", 8, _settings(load_consequence))
    assert torch.equal(again, kept) and (arm / SAMPLES_FILE).is_file()
    (arm / SAMPLES_FILE).write_bytes(b"torn")  # a torn file is drawn again, not read
    assert torch.equal(arm_samples(arm.parent, "a", 8, _settings(load_consequence)), kept)


def _settings(load_consequence):
    over = [o for o in TINY if "=" in o and o.split("=")[0].startswith(("score.", "doses", "rows", "early"))]
    return load_consequence(RECIPES / "consequence.yaml", over).score


def test_run_again_it_trains_and_scores_nothing(chain, monkeypatch, capsys):
    out, _, _ = chain
    before = json.loads((out / "consequence.json").read_text())
    stamps = {p: os.stat(p).st_mtime_ns for p in out.glob("*/r0/*/score.json")}

    def draw(*args, **kwargs):
        raise AssertionError("a score already written was sampled again")

    monkeypatch.setattr("divergence.training.sample_score.draw", draw)
    assert main(["consequence", "--out", str(out), *TINY]) == 0
    printed = capsys.readouterr().out
    assert "trained 0 pair run(s), 4 finished before" in printed
    assert "scored 0 arm(s), 8 read back from score.json" in printed
    assert {p: os.stat(p).st_mtime_ns for p in stamps} == stamps
    after = json.loads((out / "consequence.json").read_text())
    assert after == before


def test_a_run_killed_while_scoring_leaves_whole_scores_and_its_rerun_finishes_them(chain, monkeypatch, capsys):
    """Scores lost, then the run stopped at its second arm: whatever it left reads whole, and the
    run again scores the rest and writes the same result."""
    from divergence.training import sample_score

    out, _, _ = chain
    before = json.loads((out / "consequence.json").read_text())
    lost = [out / "grad-noise-0.001" / "r0" / "a", out / "seed-vs-seed" / "r0" / "a"]
    (lost[0] / "score.json").unlink()
    stale = json.loads((lost[1] / "score.json").read_text())  # written before "object" existed: scored again
    del stale["hits"]["object"], stale["rates"]["object"]
    (lost[1] / "score.json").write_text(json.dumps(stale))
    real, calls = sample_score.score_samples, []

    def stop_at_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what Ctrl-C or a kill does between two arms
        return real(*args, **kwargs)

    monkeypatch.setattr(sample_score, "score_samples", stop_at_the_second)
    code = main(["consequence", "--out", str(out), *TINY, "--jobs", "1"])  # scored in this process
    assert code == 130  # "interrupted", as a shell says
    # the first written whole, the second (stale) not rewritten: every file reads whole
    assert (lost[0] / "score.json").is_file() and json.loads((lost[1] / "score.json").read_text()) == stale
    for path in out.glob("*/r0/*/score.json"):
        json.loads(path.read_text())
    monkeypatch.setattr(sample_score, "score_samples", real)
    assert main(["consequence", "--out", str(out), *TINY]) == 0
    assert "scored 1 arm(s), 7 read back from score.json" in capsys.readouterr().out
    after = json.loads((out / "consequence.json").read_text())
    assert after == before


@pytest.mark.parametrize(
    "change,message",
    [
        ({"flavour": 1}, "unknown key 'flavour'"),
        ({"doses": [0.1, -1]}, "doses[1]: expected a finite dose"),
        ({"doses": [0.1, "abc"]}, "doses[1]: expected a finite dose"),
        ({"early": [60, 30]}, "early: expected [first step, last step]"),
        ({"score": {"sampler": "euler"}}, "score.sampler: expected one of ddim, ddpm"),
        ({"references": {"seed": REFERENCES["seed"]}}, "references.precision: missing"),
    ],
)
def test_bad_recipe_is_one_line_naming_the_key_at_exit_2(tmp_path, capsys, change, message):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(
        yaml.safe_dump({"base": str(RECIPES / "tiny.yaml"), "doses": [0.1], "references": REFERENCES, **change})
    )
    out = tmp_path / "c"
    assert main(["consequence", "--out", str(out), "--recipe", str(recipe), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and f"{recipe}: " in err
    assert not out.exists()  # refused before anything trains


def test_a_recipe_without_base_and_an_early_window_past_the_run_are_refused(tmp_path, capsys):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(yaml.safe_dump({"doses": [0.1], "references": REFERENCES}))
    assert main(["consequence", "--out", str(tmp_path / "c"), "--recipe", str(recipe)]) == 2
    assert "missing key 'base'" in capsys.readouterr().err
    assert main(["consequence", "--out", str(tmp_path / "c"), "--max-steps", "20", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "early: [30, 60] reaches past train.max_steps 20" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "c").exists()


def test_the_shipped_recipe_holds_the_ladder_rows_and_references():
    from divergence.study.consequence import load_consequence

    c = load_consequence(RECIPES / "consequence.yaml")
    roles = [(p.role, p.name) for p in c.study.pairs]
    assert [n for r, n in roles if r == "ladder"] == [f"grad-noise-{float(e)}" for e in c.doses] and len(c.doses) >= 5
    assert [n for r, n in roles if r != "ladder"] == [
        "seed-vs-seed",
        "bf16-vs-fp32",  # the row naming the precision pair is that reference, trained once
        "flash-vs-baseline",
        "reordering",
        "int8-mixed",
        "fp8-tensorwise",
    ]
    flash = next(p for p in c.study.pairs if p.name == "flash-vs-baseline")
    assert flash.recipe["recipe"]["train"]["precision"] == "bf16-mixed"  # its deployment numerics
    assert c.early == (30, 60) and c.study.replicates >= 3 and c.score.attribute == "object"
    scenes = [parse_caption(caption) for caption in c.score.captions]  # a drawn subset covers every class
    assert len(set(c.score.captions)) == len(scenes) == 81
    assert {s.colour for s in scenes} == set(range(6)) and {s.shape for s in scenes} == set(range(3))
    assert {s.size for s in scenes} == {0, 1} and {s.position for s in scenes} == set(range(9))


def test_the_result_goes_to_an_offline_wandb_run_with_its_table_and_figures(chain, tmp_path):
    from divergence.report.wandb_log import consequence_summary, log_consequence
    from tests.loggers.conftest import no_credentials
    from tests.loggers.runfile import history_keys, run_files, summary_values

    out, _, _ = chain
    result = json.loads((out / "consequence.json").read_text())
    figures = {"curve": out / "consequence.png", "samples": out / "consequence-samples.png"}
    with no_credentials(tmp_path, WANDB_DIR=str(tmp_path)):
        where = log_consequence(result, figures, out, None)
    (run,) = run_files(tmp_path)
    assert str(run.parent) == where
    deadline = time.monotonic() + 30  # wandb's service may still be writing the file's last block
    while not history_keys(run) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert {"consequence/runs", "consequence/curve", "consequence/samples"} <= history_keys(run)
    summary = summary_values(run)
    assert summary["consequence/sentence"] == result["sentence"]
    assert summary["consequence/seed_margin/probe"] == pytest.approx(result["seed_margin"]["probe"]["value"])
    assert summary["consequence/seed_distance"] == pytest.approx(result["sample_distance"]["seed"])
    assert set(consequence_summary(result)) <= set(summary)
