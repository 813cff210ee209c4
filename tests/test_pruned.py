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
