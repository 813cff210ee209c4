"""Separate-job pairs: two tiny arms trained once per session, then followed by the comparator."""

import shutil

import pytest

from divergence.training.separate_arm import train_arm
from divergence.training.lockstep import train_pair
from tests.pairs.helpers import pair_recipe
from tests.training.tiny import one_torch_thread  # noqa: F401  (autouse: tiny models, one thread)

# steps 0..4; tracked: 0, 2 (checkpoint), 3 (every), 4 (checkpoint, last); probed: 0, 2, 4 (not 3)
STEPS = (
    "train.max_steps=4",
    "train.checkpoint_every=2",
    "tracking.every=3",
    "tracking.dense=[]",
    "tracking.probe.every=2",
)


def seed_pair(*overrides):
    return pair_recipe("seed-vs-seed", *STEPS, *overrides)


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """``lockstep``: the pair trained in lockstep; ``arms``: the same pair as two separate jobs."""
    root = tmp_path_factory.mktemp("trained")
    train_pair(seed_pair(), root / "lockstep")
    for arm in "ab":
        train_arm(seed_pair(), arm, root / "arms")
    return root


@pytest.fixture
def arms(trained, tmp_path):
    """A fresh copy of the separately trained arms (no store yet)."""
    out = tmp_path / "pair"
    shutil.copytree(trained / "arms", out)
    return out
