"""Fuzzing every recipe the product reads: malformed run, pair, study and microbench recipes.

Each malformed recipe must end the real command with exit code 2 and one short line on stderr
naming the file or the key, before any model is built (so every case takes a fraction of a
second) and before anything is written. The generated cases cover YAML bombs (anchors and
aliases), deep nesting, non-finite and out-of-range numbers, wrong types, unknown keys,
strategy names, a batch no machine can hold, and bytes that are not a recipe at all.
"""

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from divergence.cli import main
from divergence.errors import RecipeError
from divergence.variants.pair_recipe import load_pair_recipe
from divergence.recipe.run import load_run_recipe
from divergence.config.yaml_safe import MAX_BYTES, MAX_DEPTH

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
ROOT = RECIPES.parent
# One line of stderr, short enough to read: however large the value the recipe holds.
MAX_LINE = 600
# Every case fails while reading the recipe, in well under a second: CPU seconds of this process
# (wall time on a shared machine measures the neighbours).
MAX_SECONDS = 5
# A recipe the machine judges (HOST_CASES) is refused after the train command has imported the
# training stack (Lightning, diffusers: several CPU seconds in a fresh process, more on a loaded
# machine); the bound only says it is refused, not trained.
HOST_SECONDS = 60


def bomb(levels: int = 9, width: int = 9) -> str:
    """A 'billion laughs' YAML: ``width ** levels`` strings from a few hundred bytes."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def nested(depth: int, flow: bool = True) -> str:
    if flow:
        return "[" * depth + "]" * depth
    return "\n".join("  " * i + f"k{i}:" for i in range(depth)) + " 1\n"


def run_cli(args, capsys):
    started = time.process_time()
    code = main(args)
    seconds = time.process_time() - started
    err = capsys.readouterr().err
    return code, err, seconds


def assert_one_line(code, err, seconds, *names, max_seconds=MAX_SECONDS):
    assert code == 2, err
    assert err.endswith("\n") and err.count("\n") == 1, err[:2000]
    assert len(err) < MAX_LINE, f"{len(err)} characters: {err[:300]}"
    assert any(name in err for name in names), (names, err)
    assert seconds < max_seconds, f"{seconds:.1f} s"


# ---- run recipes: the text of a whole file ------------------------------------------------------

RUN_FILES = {
    "bomb": (bomb(), "anchors and aliases"),
    "bomb-in-train": (bomb() + "train: {lr: *l8}\n", "anchors and aliases"),
    "bomb-353-bytes": (bomb(7, 7), "anchors and aliases"),
    "alias-only": ("train: {lr: *x}\n", "line 1"),
    "anchor-only": ("train: &t {lr: 0.001}\n", "anchors and aliases"),
    "merge-key": ("train:\n  <<: {lr: 0.001}\n", "merge keys"),
    "deep-flow": ("train: {lr: " + nested(5000) + "}\n", "nested more than"),
    "deep-block": (nested(MAX_DEPTH + 5, flow=False), "nested more than"),
    "duplicate-key": ("train:\n  lr: 0.001\n  lr: 0.002\n", "duplicate key 'lr'"),
    "int-key": ("train:\n  1: 2\n", "is not a name"),
    "bool-key": ("yes: 1\n", "is not a name"),
    "list-top": ("- 1\n- 2\n", "YAML mapping"),
    "scalar-top": ("just words\n", "YAML mapping"),
    "bad-syntax": ("train: {lr: [1, 2}\n", "not valid YAML"),
    "two-documents": ("train: {}\n---\ntrain: {}\n", "not valid YAML"),
    "python-object": ("train: !!python/object/apply:os.system [echo hi]\n", "not valid YAML"),
    "huge-int": ("train: {batch_size: " + "9" * 5000 + "}\n", "cannot be read"),
    "not-utf8": (b"train: {lr: \xff\xfe}\n", "not UTF-8"),
    "too-big": ("# " + "x" * MAX_BYTES + "\n", "KiB"),
    "unknown-section": ("trian: {lr: 0.001}\n", "trian"),
    "unknown-key": ("train: {learning_rate: 0.001}\n", "train.learning_rate"),
    "section-not-mapping": ("train: 5\n", "train"),
    "lr-inf": ("train: {lr: .inf}\n", "train.lr"),
    "lr-1e999": ("train: {lr: 1.0e999}\n", "train.lr"),
    "lr-nan": ("train: {lr: .nan}\n", "train.lr"),
    "beta-nan": ("noise: {beta_start: .nan}\n", "noise.beta_start"),
    "long-string-echoed": ("train: {precision: " + "x" * 100_000 + "}\n", "train.precision"),
    "long-list-echoed": ("train: {betas: [" + ", ".join(["0.5"] * 2_000) + "]}\n", "betas"),
}


@pytest.mark.parametrize("case", sorted(RUN_FILES))
def test_malformed_run_recipe_file_is_one_line(case, tmp_path, capsys):
    text, expected = RUN_FILES[case]
    path = tmp_path / "recipe.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path / "run"
    code, err, seconds = run_cli(["train", "--recipe", str(path), "--out", str(out)], capsys)
    assert_one_line(code, err, seconds, expected)
    if "line" in expected or "anchors" in expected or "nested" in expected or "UTF-8" in expected:
        assert str(path) in err  # a problem of the file names the file
    assert not out.exists()  # nothing started, nothing written


# ---- run recipes: command-line overrides ---------------------------------------------------------

OVERRIDES = [
    ("train.lr=1e999", "train.lr"),
    ("train.lr=-1e999", "train.lr"),
    ("train.lr=.inf", "train.lr"),
    ("train.lr=-.inf", "train.lr"),
    ("train.lr=.nan", "train.lr"),
    ("train.lr=0", "train.lr"),
    ("train.lr=-0.1", "train.lr"),
    ("train.lr=1000", "train.lr"),
    ("train.lr=fast", "train.lr"),
    ("train.eps=.inf", "train.eps"),
    ("train.grad_clip=.inf", "train.grad_clip"),
    ("train.weight_decay=1e999", "train.weight_decay"),
    ('train.strategy=""', "train.strategy"),
    ("train.strategy=' '", "train.strategy"),
    ("train.strategy=ddp_typo", "train.strategy"),
    ("train.strategy=../etc", "train.strategy"),
    ("train.strategy=[ddp]", "train.strategy"),
    ("train.batch_size=100000000", "train.batch_size"),
    ("train.batch_size=1e8", "train.batch_size"),
    ("train.batch_size=0", "batch_size"),
    ("train.batch_size=2.5", "train.batch_size"),
    ("train.batch_size=true", "train.batch_size"),
    ("train.batch_size=" + str(2**70), "train.batch_size"),
    ("data.resolution=1048576", "train.batch_size"),
    ("data.num_examples=1000000000000000", "data.num_examples"),
    ("sample.per_prompt=1000000000000", "sample.per_prompt"),
    ("noise.num_train_timesteps=1000000000000000", "noise.num_train_timesteps"),
    ("model.unet.block_out_channels=[8000000,8000000,8000000]", "model"),
    ("model.text_encoder.hidden_size=4000000", "model"),
    ("model.seed=" + str(2**64), "model.seed"),
    ("data.seed=-1", "data.seed"),
    ("train.max_steps=0", "max_steps"),
    ("train.precision=fp8", "train.precision"),
    ("train.deterministic=maybe", "train.deterministic"),
    ("train.tf32=1", "train.tf32"),
    ("train.bogus=1", "train.bogus"),
    ("train.lr=[&a [1,2], *a]", "anchors and aliases"),
    ("train.lr=" + "[" * 1000 + "]" * 1000, "nested more than"),
    ("train", "KEY=VALUE"),
    ("=1", "key is empty"),
    ("train.lr.x=1", "not a section"),
]


@pytest.mark.parametrize("override, key", OVERRIDES, ids=[o[:40] for o, _ in OVERRIDES])
def test_malformed_override_is_one_line(override, key, tmp_path, capsys):
    out = tmp_path / "run"
    code, err, seconds = run_cli(["train", "--recipe", str(RECIPES / "tiny.yaml"), "--out", str(out), override], capsys)
    assert_one_line(code, err, seconds, key)
    assert not out.exists()


def test_batch_refusal_explains_the_rule(tmp_path, capsys):
    code, err, _ = run_cli(["train", "--out", str(tmp_path / "run"), "train.batch_size=100000000"], capsys)
    assert code == 2
    assert "need at least" in err and "use at most" in err and "memory" in err, err


# ---- pair recipes ------------------------------------------------------------------------------


def _pair(**changes) -> dict:
    data = {"name": "p", "base": str(RECIPES / "tiny.yaml"), "arms": {"a": [{"adamw-impl": "fused"}], "b": []}}
    data.update(changes)
    return data


PAIRS = {
    "bomb-in-arms": (
        bomb() + f"name: p\nbase: {RECIPES / 'tiny.yaml'}\narms: {{a: *l8, b: []}}\n",
        "anchors and aliases",
    ),
    "unknown-key": (_pair(bogus=1), "bogus"),
    "arms-list": (_pair(arms=[1, 2]), "arms"),
    "arm-not-list": (_pair(arms={"a": 5, "b": []}), "arms.a"),
    "three-arms": (_pair(arms={"a": [], "b": [], "c": []}), "arms"),
    "unknown-variant": (_pair(arms={"a": ["warp-speed"], "b": []}), "arms.a[0]"),
    "variant-not-hashable": (_pair(arms={"a": [{"seed": 1, "x": 2}], "b": []}), "arms.a[0]"),
    "seed-negative": (_pair(arms={"a": [{"seed": -1}], "b": []}), "arms.a[0]"),
    "seed-huge": (_pair(arms={"a": [{"seed": 2**64}], "b": []}), "model.seed"),
    "tf32-not-bool": (_pair(arms={"a": [{"tf32": "yes please"}], "b": []}), "arms.a[0]"),
    "identical-arms": (_pair(arms={"a": [], "b": []}), "identical"),
    "control-not-bool": (_pair(control="yes"), "control"),
    "tracking-inf": (_pair(tracking={"spike_factor": float("inf")}), "tracking.spike_factor"),
    "tracking-every-zero": (_pair(tracking={"every": 0}), "tracking.every"),
    "recipe-lr-inf": (_pair(recipe={"train": {"lr": float("inf")}}), "train.lr"),
    "recipe-strategy-empty": (_pair(recipe={"train": {"strategy": ""}}), "train.strategy"),
    "recipe-huge-batch": (_pair(recipe={"train": {"batch_size": 10**8}}), "train.batch_size"),
    "base-missing": (_pair(base="nope.yaml"), "nope.yaml"),
    "base-nul": (_pair(base="a\x00b.yaml"), "base"),
    "base-folder": (_pair(base="."), "base"),
    "base-loop": (_pair(base="loop.yaml"), "loop.yaml"),
    "base-is-a-pair": (_pair(base="pair.yaml"), "arms"),
    "long-name-echoed": (_pair(name="x" * 100_000), "name"),
    "name-escapes": (_pair(name="../../evil"), "name"),
    "name-not-string": (_pair(name=[1, 2]), "name"),
    "long-variant-echoed": (_pair(arms={"a": [{"precision": "x" * 50_000}], "b": []}), "arms.a[0]"),
}


HOST_CASES = {"recipe-huge-batch"}  # refused by divergence.training.host where a run starts


@pytest.mark.parametrize("case", sorted(PAIRS))
def test_malformed_pair_recipe_is_one_line(case, tmp_path, capsys):
    data, key = PAIRS[case]
    path = tmp_path / "pair.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    (tmp_path / "loop.yaml").symlink_to(tmp_path / "loop.yaml")
    if case in HOST_CASES:  # a recipe is read on any machine; the machine that starts the run judges it
        load_pair_recipe(path)
    else:
        with pytest.raises(RecipeError):  # refused while reading: the command below trains nothing
            load_pair_recipe(path)
    out = tmp_path / "run"
    for extra in ([], ["--arm", "a"]):
        code, err, seconds = run_cli(["train", "--recipe", str(path), "--out", str(out), *extra], capsys)
        assert_one_line(code, err, seconds, key, max_seconds=HOST_SECONDS if case in HOST_CASES else MAX_SECONDS)
        assert not out.exists()


# ---- study recipes ------------------------------------------------------------------------------


def _study(**changes) -> dict:
    data = {
        "name": "s",
        "base": str(RECIPES / "tiny.yaml"),
        "study": str(RECIPES / "pairs/fused-adamw.yaml"),
        "references": {"control": str(RECIPES / "pairs/control.yaml")},
    }
    data.update(changes)
    return data


STUDIES = {
    "bomb": (bomb() + "name: s\n", "anchors and aliases"),
    "deep": ("name: s\nrecipe: " + nested(200) + "\n", "nested more than"),
    "base-missing": (_study(base="nope.yaml"), "nope.yaml"),
    "base-nul": (_study(base="a\x00b.yaml"), "base"),
    "unknown-key": (_study(bogus=1), "bogus"),
    "references-list": (_study(references=[1]), "references"),
    "jobs-inf": (_study(jobs=float("inf")), "jobs"),
    "lr-inf": (_study(recipe={"train": {"lr": float("inf")}}), "train.lr"),
    "strategy-empty": (_study(recipe={"train": {"strategy": ""}}), "train.strategy"),
    "huge-batch": (_study(recipe={"train": {"batch_size": 10**8}}), "train.batch_size"),
    "inline-name-escapes": (_study(study={"name": "../x", "arms": {"a": ["tf32"], "b": []}}), "name"),
    "inline-unknown-variant": (_study(study={"name": "x", "arms": {"a": ["nope"], "b": []}}), "study.arms.a[0]"),
    "name-null": (_study(name=None), "name"),
    "name-shell": (_study(name="s$(touch x)"), "name"),
}


@pytest.mark.parametrize("case", sorted(STUDIES))
def test_malformed_study_recipe_is_one_line(case, tmp_path, capsys):
    data, key = STUDIES[case]
    path = tmp_path / "study.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    out = tmp_path / "study"
    code, err, seconds = run_cli(["study", "--recipe", str(path), "--out", str(out), "--no-wandb", "--quiet"], capsys)
    assert_one_line(code, err, seconds, key)
    assert not out.exists()  # nothing trained, nothing written (not even OUT/recipes)


def test_microbench_recipe_refuses_a_bomb(tmp_path, capsys):
    path = tmp_path / "mb.yaml"
    path.write_text(bomb() + "sweep: {seq_lens: *l8}\n")
    code, err, seconds = run_cli(["microbench", "--recipe", str(path), "--out", str(tmp_path / "mb")], capsys)
    assert_one_line(code, err, seconds, str(path))


# ---- random mutations of the shipped recipe ------------------------------------------------------

BAD_VALUES = [
    float("inf"),
    float("-inf"),
    float("nan"),
    1e308 * 10,
    -1,
    0,
    2**64,
    -(2**64),
    "",
    " ",
    "x" * 10_000,
    [],
    {},
    [[[[1]]]],
    None,
    True,
    1.5,
    10**12,
    {"k": "v"},
]


def _leaves(data, prefix=""):
    for key, value in data.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_random_mutations_of_tiny_are_loaded_or_refused_in_one_line(tmp_path):
    """A seeded sweep over every leaf of tiny.yaml with hostile values: the loader either accepts
    a value that is valid or raises one short RecipeError naming the key; never anything else."""
    base = yaml.safe_load((RECIPES / "tiny.yaml").read_text())
    rng = random.Random(0)
    leaves = sorted(_leaves(base))
    started = time.process_time()
    refused = 0
    for i in range(120):
        key, value = rng.choice(leaves), rng.choice(BAD_VALUES)
        data = yaml.safe_load((RECIPES / "tiny.yaml").read_text())
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
        path = tmp_path / f"m{i}.yaml"
        path.write_text(yaml.safe_dump(data))
        try:
            load_run_recipe(path)
        except RecipeError as err:
            refused += 1
            message = str(err)
            assert "\n" not in message and len(message) < MAX_LINE, (key, value, message[:300])
            assert leaf in message or parents[0] in message, (key, value, message)
    assert refused > 80  # most hostile values are refused (a few, such as 0 for a seed, are valid)
    assert time.process_time() - started < 60


def test_real_command_refuses_the_bomb_fast(tmp_path):
    """Through ``python -m divergence`` as a user runs it: exit 2, one line, in seconds."""
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb() + "train: {lr: *l8}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "divergence", "train", "--recipe", str(path), "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and str(path) in proc.stderr, proc.stderr[:2000]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "saved, recipe", [("recipe.yaml", RECIPES / "tiny.yaml"), ("pair.yaml", RECIPES / "pairs" / "control.yaml")]
)
def test_a_bomb_in_a_copied_run_folder_is_refused(saved, recipe, tmp_path, capsys):
    """A run folder copied in from elsewhere, its saved recipe a YAML bomb: refused, not walked."""
    out = tmp_path / "run"
    (out / "resume").mkdir(parents=True)
    (out / saved).write_text(bomb())
    code, err, seconds = run_cli(["train", "--recipe", str(recipe), "--out", str(out)], capsys)
    # read after the training code is imported (the first import costs seconds), before any model
    assert_one_line(code, err, seconds, str(out / saved), max_seconds=30)
