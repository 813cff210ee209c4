"""What was pruned stays pruned: no alias package, no renamed constant, no legacy statistic."""

import importlib

import pytest


@pytest.mark.parametrize("module", ["divergence.integrations", "divergence.analysis.legacy"])
def test_removed_modules_are_gone(module):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)


def test_the_analysis_exports_one_name_per_constant():
    import divergence.analysis as analysis

    assert not hasattr(analysis, "MIN_STEPS") and "MIN_STEPS" not in analysis.__all__
    assert analysis.MIN_WINDOW == 5  # the one name of the window's minimum length
    assert not hasattr(analysis, "compare_growth") and not hasattr(analysis, "Ratio")


# tests that plant a date or a development-machine phrase to check that it is refused
PLANTED = {"tests/test_pruned.py", "tests/docs/test_measurements.py"}


@pytest.mark.parametrize("tree", ["divergence", "tests"])
def test_comments_say_what_the_code_does_not_when_or_where_it_was_written(tree):
    """No issue numbers, dates or "the machine this project is developed on" in the source or its tests."""
    import re
    from pathlib import Path

    history = re.compile(r"\bissue \d+|\bissue #\d+|developed on|\b20\d\d-[01]\d-[0-3]\d\b", re.IGNORECASE)
    repo = Path(__file__).resolve().parents[1]
    found = [
        f"{path.relative_to(repo)}:{number}: {line.strip()}"
        for path in sorted((repo / tree).rglob("*.py"))
        if path.relative_to(repo).as_posix() not in PLANTED
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if history.search(line)
    ]
    assert not found, "\n".join(found)
