"""The tracking schedule: one rule (records.is_tracked) for the tracker, the arm jobs and the comparator."""

import pytest

from divergence.errors import RecipeError
from divergence.pairfolder.settings import TrackingConfig
from divergence.config.schema import parse
from divergence.pairfolder.settings import is_tracked


def _tracked(tracking, max_steps=300, checkpoint_every=0):
    return [s for s in range(max_steps + 1) if is_tracked(s, max_steps, tracking, checkpoint_every)]


def test_default_is_dense_early_then_every():
    steps = _tracked(TrackingConfig(every=10), max_steps=205)
    assert steps[:21] == list(range(21))  # every step to 20
    assert steps[21:37] == list(range(25, 101, 5))  # every 5 to 100
    assert steps[37:] == [*range(110, 201, 10), 205]  # then every 10, and the last step


def test_custom_dense_and_off():
    tracking = parse(TrackingConfig, {"every": 50, "dense": [[4, 2], [10, 3]]})
    assert _tracked(tracking, 120) == [0, 2, 4, 6, 9, 50, 100, 120]
    assert _tracked(TrackingConfig(every=7, dense=()), 30, checkpoint_every=10) == [0, 7, 10, 14, 20, 21, 28, 30]
    # the dense schedule adds steps, never removes one that tracking.every asks for
    assert _tracked(TrackingConfig(every=2, dense=((6, 1), (20, 5))), 22) == [
        0,
        1,
        2,
        3,
        4,
        5,
        6,
        8,
        10,
        12,
        14,
        15,
        16,
        18,
        20,
        22,
    ]


@pytest.mark.parametrize("dense", [[[20, 1], [10, 5]], [[20, 0]], [[20]], [[0, 1]], [[5, 1], [5, 2]]])
def test_bad_dense_schedules_name_the_key(dense):
    with pytest.raises(RecipeError, match="tracking.dense: expected"):
        parse(TrackingConfig, {"dense": dense}, "tracking")
