"""A ``calibration.json`` given to ``report --calibration``: read, or refused in one line naming the
file and the key (``null``, a number, ``criteria`` as a string ... never a traceback)."""

import copy
import json
import math
import random

import pytest

from divergence.analysis import analyze, to_summary
from divergence.cli import main
from divergence.errors import UserInputError
from divergence.report.build import load_calibration
from divergence.report.content import calibration_text
from divergence.report.inputs import load_pairs
from tests.analysis.synthetic import dose_pair, write_dose_study


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return write_dose_study(tmp_path_factory.mktemp("study"), replicates=2, horizon=120, control=1e-10)


@pytest.fixture(scope="module")
def pairs(study):
    return load_pairs([study])


@pytest.fixture(scope="module")
def calibration():
    """A real calibration of the study's recipe (a synthetic ladder of 5 doses, 3 replicates)."""
    from divergence.analysis.calibration import evaluate
    from divergence.tables import json_safe

    ladder = {
        eps: [dose_pair(f"grad-noise-{eps:g}", "optimization", eps, replicate=r, horizon=120) for r in range(3)]
        for eps in (1e-9, 1e-8, 1e-7, 1e-6, 1e-5)
    }
    seeds = [dose_pair("seed-vs-seed", "seed", 0.0, replicate=r, horizon=120) for r in range(3)]
    return json.loads(json.dumps(json_safe(evaluate(ladder, seeds, horizons=(60, 120)))))  # as calibrate writes it


def _with(calibration, dotted: str, value):
    data = copy.deepcopy(calibration)
    *parents, last = dotted.split(".")
    node = data
    for key in parents:
        node = node[key]
    node[last] = value
    return data


def _variants(c):
    """The issue's malformed files, and the other ways each key the readers use can be wrong."""
    return {
        "null": (None, "the file"),
        "a number": (3, "the file"),
        "a list": ([1, 2], "the file"),
        "an empty object": ({}, "recipe is missing"),
        "criteria as a string": (_with(c, "criteria", "all passed"), "criteria is a string"),
        "a criterion as a number": (_with(c, "criteria.slope", 1), "criteria.slope is a number"),
        "pass as a string": (_with(c, "criteria.slope.pass", "yes"), "criteria.slope.pass"),
        "recipe as a string": (_with(c, "recipe", "abc"), "recipe is a string"),
        "recipe id as a number": (_with(c, "recipe.id", 7), "recipe.id"),
        "line as a list": (_with(c, "line", [1.0, 0.0]), "line is a list"),
        "slope as a string": (_with(c, "line.slope", "1.0"), "line.slope"),
        "anchor dose 0": (_with(c, "line.anchor_eps", 0), "line.anchor_eps"),
        "curve steps as numbers": (_with(c, "anchor_curve.steps", [1.5] * 3), "anchor_curve.steps"),
        "curve of two lengths": (_with(c, "anchor_curve.log10_rel_l2", [0.0]), "anchor_curve has"),
        "references as a list": (_with(c, "references", ["seed-vs-seed"]), "references is a list"),
        "a reference without its value": (_with(c, "references", {"x": {}}), "references.x.log10_vs_anchor"),
        "floor as a string": (_with(c, "criteria.recovery.floor_eps", "1e-6"), "criteria.recovery.floor_eps"),
    }


def test_each_malformed_calibration_is_one_line_naming_the_file_and_key(study, calibration, tmp_path, capsys):
    run = str(study / "flash-vs-baseline-r0")
    for case, (data, key) in _variants(calibration).items():
        path = tmp_path / f"{case.replace(' ', '-')}.json"
        path.write_text(json.dumps(data))
        args = ["report", run, "--calibration", str(path), "--no-wandb", "--out", str(tmp_path / "r")]
        assert main(args) == 2, case
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("divergence report: error: "), (case, err)
        assert str(path) in err and key in err, (case, err)
        assert not (tmp_path / "r").exists(), case  # refused before any report file


def test_the_calibration_itself_is_read_and_used(pairs, calibration, tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(calibration))
    analysis = analyze(pairs, n_boot=50, calibration=load_calibration(path, []))
    assert analysis.verdicts[0].dose.equivalent is not None
    assert calibration_text(analysis)[0].startswith("Calibration ladder")


_BAD = [None, True, -1, 0, 1.5, float("nan"), "x", "", [], [1, "a"], {}, {"a": 1}]


def _nodes(node, path=()):
    """Every (path, value) of a JSON document, the root excluded."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield (*path, key), value
        yield from _nodes(value, (*path, key))


@pytest.mark.parametrize("seed", range(30))
def test_a_calibration_mutated_anywhere_is_read_or_refused_in_one_line(pairs, calibration, tmp_path, seed):
    """One node of a real calibration replaced by a value of another type, or deleted: either the
    file is refused in one line naming it, or every reader of it works (the verdict's equivalent
    dose, summary.json, the report's paragraph)."""
    rng = random.Random(seed)
    data = copy.deepcopy(calibration)
    where, _ = rng.choice(list(_nodes(data)))
    parent = data
    for key in where[:-1]:
        parent = parent[key]
    if rng.random() < 0.2 and isinstance(parent, dict):
        del parent[where[-1]]
    else:
        parent[where[-1]] = rng.choice(_BAD)
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(data))
    try:
        read = load_calibration(path, [])
    except UserInputError as err:
        assert str(path) in str(err) and "\n" not in str(err), where
        return
    analysis = analyze(pairs, n_boot=20, calibration=read)
    summary = to_summary(analysis)
    json.dumps(summary)  # what summary.json holds
    calibration_text(analysis)
    dose = analysis.verdicts[0].dose.equivalent
    assert dose is None or (math.isfinite(dose) and dose > 0), where
