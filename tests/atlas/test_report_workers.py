"""The atlas's reports built in worker processes: the same files and rows as one at a time, and the
first failing report's own one-line error."""

import json
import os

import pytest

from divergence.atlas.runner import build_reports
from divergence.errors import UserInputError
from tests.analysis.synthetic import write_dose_study


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return write_dose_study(tmp_path_factory.mktemp("atlas"), replicates=1, horizon=20, seed=False, precision=None)


def _builds(study, out):
    return [
        ([study / "flash-vs-baseline-r0", study / "control-r0"], out / "flash"),
        ([study / "control-r0"], out / "c"),
    ]


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*.png"))}


def test_reports_built_in_two_workers_are_those_built_one_at_a_time(study, tmp_path):
    one = build_reports(_builds(study, tmp_path / "one"), None, workers=1, n_boot=20)
    two = build_reports(_builds(study, tmp_path / "two"), None, workers=2, n_boot=20)
    strip = [json.dumps({k: v for k, v in s.items() if k != "generated"}) for s in (*one, *two)]  # NaN != NaN
    assert strip[:2] == strip[2:] and strip[0] != strip[1]  # in order, and not one summary twice
    for name in ("flash", "c"):
        written = json.loads((tmp_path / "two" / name / "summary.json").read_text())
        assert written["figures"] == two[["flash", "c"].index(name)]["figures"]
        assert _files(tmp_path / "one" / name) == _files(tmp_path / "two" / name)  # pixel for pixel
    assert len(_files(tmp_path / "two" / "flash")) > len(_files(tmp_path / "two" / "c")) > 0


def test_a_failing_report_in_a_worker_is_its_own_one_line_error(study, tmp_path):
    builds = [([study / "control-r0"], tmp_path / "c"), ([tmp_path / "missing"], tmp_path / "m")]
    with pytest.raises(UserInputError, match=r"^\S*missing: not a folder; give a pair run folder") as err:
        build_reports(builds, None, workers=2, n_boot=20)
    assert "\n" not in str(err.value)


def test_a_pair_run_is_read_once_and_again_when_its_files_change(study, monkeypatch):
    from divergence.report import inputs

    reads = []
    read = inputs._read_pair
    monkeypatch.setattr(inputs, "_read_pair", lambda folder: reads.append(folder) or read(folder))
    folder = study / "control-r0"
    with inputs.reuse_loaded_pairs():
        first = inputs.load_pair(folder)
        first.steps[:] = -1  # a report changing what it was handed
        again = inputs.load_pair(folder)
        assert len(reads) == 1 and again.steps[0] >= 0 and again.name == first.name
        stat = (folder / "pair.json").stat()
        os.utime(folder / "pair.json", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
        inputs.load_pair(folder)
        assert len(reads) == 2
    inputs.load_pair(folder)  # outside: read every time, nothing kept
    assert len(reads) == 3 and inputs._loaded is None
