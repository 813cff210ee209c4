"""One tiny lockstep pair with the shadow attention variant, logged to an offline wandb run.

It trains once per session (about ten seconds) with no wandb credentials at all (no
WANDB_MODE, no WANDB_API_KEY, NETRC pointing at a missing file), so the run goes offline by
the documented rule, and every key family is logged: whole model, kinds, losses and spikes,
layer tables and heatmaps (the last step), attention-output deviation, artifacts.
"""

import contextlib
import io
import os

import pytest

from tests.training.tiny import one_torch_thread  # noqa: F401  (autouse: tiny models, one thread)

SHADOW = "arms.a=[{attention: {name: shadow, options: {primary: sdpa-flash, secondary: baseline}}}]"


@contextlib.contextmanager
def no_credentials(tmp, **extra):
    """No WANDB_MODE, WANDB_API_KEY or netrc: the default decides (offline), as for a new user."""
    saved = dict(os.environ)
    for key in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "WANDB_RUN_GROUP", "WANDB_PROJECT", "WANDB_TAGS"):
        os.environ.pop(key, None)
    os.environ.update({"NETRC": str(tmp / "missing-netrc"), "WANDB_SILENT": "true", **extra})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def shadow_pair(tmp_path_factory):
    """(pair folder, what the run printed)."""
    import torch

    from divergence.training.pair_run import train_pair
    from tests.pairs.helpers import pair_recipe

    tmp = tmp_path_factory.mktemp("wandb")
    out = tmp / "study-x" / "flash-vs-baseline"
    pair = pair_recipe("flash-vs-baseline", "train.max_steps=2", "tracking.every=1", "tracking.attention_every=1",
                       "train.checkpoint_every=0", SHADOW, "log.wandb=true", "log.artifacts=[2]",
                       "log.tags=[nightly]")
    printed = io.StringIO()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with no_credentials(tmp), contextlib.redirect_stdout(printed):
            train_pair(pair, out)
    finally:
        torch.set_num_threads(threads)
    return out, printed.getvalue()
