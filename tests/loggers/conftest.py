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

    from divergence.training.lockstep import train_pair
    from tests.pairs.helpers import pair_recipe

    tmp = tmp_path_factory.mktemp("wandb")
    out = tmp / "study-x" / "flash-vs-baseline"
    pair = pair_recipe(
        "flash-vs-baseline",
        "train.max_steps=2",
        "tracking.every=1",
        "tracking.attention_every=1",
        "train.checkpoint_every=0",
        SHADOW,
        "log.wandb=true",
        "log.artifacts=[2]",
        "log.tags=[nightly]",
    )
    printed = io.StringIO()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with no_credentials(tmp), contextlib.redirect_stdout(printed):
            train_pair(pair, out)
    finally:
        torch.set_num_threads(threads)
    return out, printed.getvalue()


# A summary.json of schema 2: each verdict with its dose ratio and outcome.
SUMMARY = {
    "settings": {"bootstrap_replicates": 200, "seed": 0},
    "pairs": {"flash-vs-baseline": {"growth_rate": {}}},
    "verdicts": [
        {
            "study": "flash-vs-baseline",
            "status": "bounded",
            "headline": "Bounded: flash vs baseline ...",
            "dose_ratio": {
                "reference": "bf16-vs-fp32",
                "metric": "rel_l2",
                "log10": -3.9,
                "lo": -4.2,
                "hi": -3.6,
                "replicates": 3,
                "window": [1, 40],
            },
            "outcome": {"mean": 0.001, "lo": -0.002, "hi": 0.004, "margin": 0.01},
        }
    ],
}


@pytest.fixture(scope="session")
def report_run(shadow_pair, tmp_path_factory):
    """The report's offline wandb run over the shadow pair's folder: (report folder, where)."""
    from divergence.report.wandb_log import log_report

    tmp = tmp_path_factory.mktemp("report")
    out = tmp / "report"
    out.mkdir()
    (out / "report.md").write_text("# report\n")
    with no_credentials(tmp):
        where = log_report(SUMMARY, {}, [out / "report.md"], out, None, [shadow_pair[0]])
    return out, where
