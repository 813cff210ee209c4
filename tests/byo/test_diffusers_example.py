"""``examples/diffusers_text_to_image.py`` as a user runs it: two arms (seed 0 vs 1), one preempted and
resumed from its ``checkpoint-N/`` folder, then ``watch``, ``report`` and ``track``.

The arms run in this process one after the other (each a fresh ``Accelerator``); a job of its
own would pay the imports again (about 15 s each on these cores).
"""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from divergence.cli import main as cli
from divergence.pairfolder.layout import CHECKPOINTS_DIR, LOSSES_FILE
from divergence.store import MetricsStore

pytest.importorskip("accelerate")
pytest.importorskip("diffusers")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "diffusers_text_to_image.py"
METRICS = ("max_abs_diff", "rel_l2", "wasserstein")


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: the tiny UNet's kernels are too small to share, and the cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_example(*argv) -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    spec = importlib.util.spec_from_file_location("diffusers_text_to_image", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main([str(a) for a in argv]) == 0


def arm(tmp_path, out, seed, pair, arm_name, *extra):
    run_example(
        "--output_dir", tmp_path / out, "--seed", seed, "--divergence_dir", tmp_path / pair,
        "--divergence_arm", arm_name, *extra,
    )  # fmt: skip


def step_metrics(store: MetricsStore) -> dict[int, tuple]:
    return {r["step"]: tuple(r[m] for m in METRICS) for r in store.step_records() if r.get("tracked", True)}


def test_two_arms_with_a_resume_then_watch_report_track(tmp_path, capsys):
    # arm a (seed 0): preempted after step 3, resumed from its latest checkpoint (checkpoint-2)
    arm(tmp_path, "seed0", 0, "pair", "a", "--stop_after_steps", 3)
    arm_a = tmp_path / "pair" / "a"
    kept = {p.name: p.read_bytes() for p in (arm_a / CHECKPOINTS_DIR).iterdir() if int(p.stem[5:]) <= 2}
    losses_before = (arm_a / LOSSES_FILE).read_text().splitlines()
    assert len(losses_before) == 3 and len(kept) == 3
    arm(tmp_path, "seed0", 0, "pair", "a", "--resume_from_checkpoint", "latest")
    for name, data in kept.items():  # the steps before the resume are never rewritten
        assert (arm_a / CHECKPOINTS_DIR / name).read_bytes() == data
    losses = (arm_a / LOSSES_FILE).read_text().splitlines()
    assert losses[:2] == losses_before[:2] and [json.loads(x)["step"] for x in losses] == list(range(1, 7))
    arm(tmp_path, "seed1", 1, "pair", "b")

    assert cli(["watch", str(tmp_path / "pair"), "--poll", "0.1", "--timeout", "60", "--quiet", "--no-wandb"]) == 0
    store = MetricsStore(tmp_path / "pair")
    assert store.steps() == list(range(7))
    watched = step_metrics(store)
    assert watched[0][0] == 0.0  # the same pretrained weights in both arms
    assert watched[6][0] > 0  # another seed: other noise and timesteps
    pair = json.loads((tmp_path / "pair" / "pair.json").read_text())
    assert (pair["name"], pair["category"]) == ("diffusers-text-to-image", "seed")

    # the resume is exact: the resumed arm against an uninterrupted seed-0 run measures zero at every step
    arm(tmp_path, "seed0-straight", 0, "control", "a", "--divergence_name", "resume-check", "--divergence_category", "control")  # fmt: skip
    shutil.copytree(arm_a, tmp_path / "control" / "b")
    (tmp_path / "control" / "b" / "writer.lock").unlink(missing_ok=True)
    status = json.loads((tmp_path / "control" / "b" / "status.json").read_text())
    (tmp_path / "control" / "b" / "status.json").write_text(json.dumps({**status, "arm": "b"}))
    assert cli(["watch", str(tmp_path / "control"), "--poll", "0.1", "--timeout", "60", "--quiet", "--no-wandb"]) == 0
    control = MetricsStore(tmp_path / "control")
    assert {step: m[0] for step, m in step_metrics(control).items()} == {s: 0.0 for s in range(7)}

    assert cli(["report", str(tmp_path / "pair"), "--out", str(tmp_path / "report"), "--no-wandb"]) == 0
    assert (tmp_path / "report" / "summary.json").is_file()

    # track over the two runs' checkpoint-N/unet folders equals watch at those steps, bit for bit
    capsys.readouterr()
    code = cli(
        ["track", str(tmp_path / "seed0"), str(tmp_path / "seed1"), "--component", "unet",
         "--out", str(tmp_path / "tracked"), "--quiet"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    tracked = step_metrics(MetricsStore(tmp_path / "tracked"))
    assert sorted(tracked) == [2, 4, 6]
    assert tracked == {s: watched[s] for s in (2, 4, 6)}


def test_the_readme_lines_are_the_example_lines():
    """Every piece of code in the docs' diffusers block (docs/your-training.md) is in the example, as written."""
    readme = (EXAMPLE.parents[1] / "docs" / "your-training.md").read_text()
    start = readme.index("## An accelerate + diffusers script")
    block = readme[start:].split("```python\n", 1)[1].split("```", 1)[0]
    source = EXAMPLE.read_text()
    pieces = [p.strip() for line in block.splitlines() for p in line.split("#", 1)[0].split(",")]
    missing = [p for p in pieces if p and p not in source]
    assert not missing and len([p for p in pieces if p]) > 10
    assert sum("# divergence:" in line for line in source.splitlines()[1:]) == 6  # the six statements
