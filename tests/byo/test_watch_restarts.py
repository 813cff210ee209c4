"""``divergence watch`` over arms that restart, retry or die (issue 28, third hardening pass, part B):
a correct store, or one line and exit 2, and nothing lost. Arms are written through ``ArmWriter``
with tiny modules, as a user's loop writes them."""

import torch

from divergence.comparator.follow import Comparator
from divergence.errors import CheckpointError
from divergence.store import MetricsStore
from divergence.writers import ArmWriter


def write_arm(out, arm, losses, every=1, start=0, state=None, **options):
    """Arm ``arm`` recording ``losses`` (``{step: loss}``, in order) with a tiny linear module."""
    net = torch.nn.Linear(2, 2)
    writer = ArmWriter(out, arm, every=every, dense=[], log={"wandb": False}, start_step=start, **options)
    if start == 0:
        writer.record(0, net)
    for step, loss in losses.items():
        with torch.no_grad():
            net.weight.add_(0.01 * loss)
        writer.record(step, net, loss)
    writer.finish(state)
    return writer


class FailsOnce:
    """A function-space probe (``Comparator``'s ``probe`` interface) whose first reading fails as a
    file replaced mid-read does."""

    def __init__(self, step):
        self.step, self.failed = step, False

    def due(self, step):
        return True

    def record(self, paths):
        if not self.failed and str(self.step).zfill(6) in str(paths["a"]):
            self.failed = True
            raise CheckpointError("replaced while read")
        return {}


def test_a_step_retried_after_a_probe_failure_feeds_the_spike_detector_once(tmp_path):
    """Finding 8: the retry of step 2 fed its loss to the detectors twice, so step 3 (5x the median)
    was flagged a spike before the window (3 losses) was full."""
    losses = {1: 1.0, 2: 1.0, 3: 5.0}
    for arm in "ab":
        write_arm(tmp_path, arm, losses, max_steps=3, spike_window=3)
    comparator = Comparator(tmp_path, log=False, progress=False)
    comparator.probe = FailsOnce(2)
    assert comparator.run(poll=0.01, timeout=5) == 0
    assert comparator.probe.failed  # step 2 was retried
    assert comparator.recorder.spikes["a"].history == [1.0, 1.0, 5.0]
    assert [r["spike_a"] for r in MetricsStore(tmp_path).step_records()[1:]] == [False, False, False]
