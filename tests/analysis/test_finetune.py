"""A fine-tune gets a verdict: pairs that all start from the same pretrained weights.

A tiny plain-torch MLP is pretrained, then four pairs are fine-tuned from its weights through
``ArmWriter`` (the writers, ``watch``'s comparator and the report's reader are the real ones):

    split-sum     arm a sums one layer's matmul in two halves (a reordering of fp32 sums: flash-like)
    bf16-vs-fp32  arm a under bf16 autocast                     (the precision reference)
    data-order    arm a draws its batches from another seed    (the data-order seed reference)
    control       identical arms

Every pair's E(0) is 0, the seed pair's too. Measured in memory (replicate 0, SGD): E of
data-order 0.011 at step 1 and 0.025 at step 16, about one arm's displacement from the start
(0.005 to 0.025); bf16 2.2e-5 to 8.5e-5; split-sum 2.2e-9 to 1.5e-8, log10(E_X / E_P) -3.9 to -3.8
at every step: both grow alike, so the window holds and the dose ratio reads about -3.8.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from divergence.analysis import analyze
from divergence.analysis.finetune import FROM_START, FROM_WEIGHTS, SATURATED_FINETUNE, recognize
from divergence.comparator.follow import Comparator
from divergence.errors import UserInputError
from divergence.report import content
from divergence.report.inputs import load_pairs
from divergence.writers import ArmWriter, write_pair_files
from tests.analysis.synthetic import make_pair

STEPS, PRETRAIN, REPLICATES = 16, 60, 2
START = "sha256:tiny-mlp-pretrained"
PAIRS = {  # name: (category, arm a's change; arm b trains in fp32 on the replicate's data seed)
    "split-sum": ("optimization", {"split": True}),
    "bf16-vs-fp32": ("precision", {"bf16": True}),
    "data-order": ("seed", {"data_seed": 1}),
    "control": ("control", {}),
}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = torch.nn.Linear(16, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 1)

    def forward(self, x, split=False):
        h = torch.tanh(self.l1(x))
        if split:  # the same sum in another order
            w = self.l2.weight
            h = h[:, :32] @ w[:, :32].T + h[:, 32:] @ w[:, 32:].T + self.l2.bias
        else:
            h = self.l2(h)
        return self.l3(torch.tanh(h))


def data():
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(1024, 16, generator=g)
    return x, torch.sin(x @ torch.randn(16, 1, generator=g)) + 0.1 * torch.randn(1024, 1, generator=g)


def batches(seed: int, steps: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 1024, (32,), generator=g) for _ in range(steps)]


def pretrained(x, y) -> dict:
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    for idx in batches(99, PRETRAIN):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x[idx]), y[idx]).backward()
        opt.step()
    return {k: v.clone() for k, v in net.state_dict().items()}


def fine_tune(start, x, y, writer, data_seed: int, split=False, bf16=False) -> None:
    net = Net()
    net.load_state_dict(start)
    opt = torch.optim.SGD(net.parameters(), 0.05)
    writer.record(0, net)
    for step, idx in enumerate(batches(data_seed, STEPS), 1):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = net(x[idx], split=split)
        loss = torch.nn.functional.mse_loss(out.float(), y[idx])
        loss.backward()
        opt.step()
        writer.record(step, net, loss)
    writer.finish()


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    x, y = data()
    start = pretrained(x, y)
    for r in range(REPLICATES):
        for name, (category, change) in PAIRS.items():
            if category == "control" and r:
                continue
            folder = root / f"{name}-r{r}"
            for arm in "ab":
                kw = dict(change) if arm == "a" else {}
                seed = 100 * r + kw.pop("data_seed", 0)
                writer = ArmWriter(folder, arm, max_steps=STEPS, name=name, category=category, replicate=r, start=START)
                fine_tune(start, x, y, writer, seed, **kw)
            assert Comparator(folder, log=False, progress=False).run(poll=0.01, timeout=30) == 0
    return root


def test_armwriter_pairs_from_one_start_get_a_verdict(study):
    assert json.loads((study / "split-sum-r0" / "pair.json").read_text())["start"] == START
    result = analyze(load_pairs([study]), n_boot=20)
    (verdict,) = result.verdicts
    assert verdict.status == "bounded", verdict.headline  # not "no verdict: saturated at once"
    assert (
        -4.5 < verdict.dose.ratio.lo < verdict.dose.ratio.hi < -3
    )  # about -3.8: a reordering of fp32 sums, far below bf16
    assert verdict.caveats[0].startswith(f"a fine-tune (recognized from {FROM_START} ({START})): ")
    assert (
        f"{SATURATED_FINETUNE:g} E_S, E_S the difference of the data-order seed pair (data-order)" in verdict.caveats[0]
    )
    assert result.settings["fine_tune"]["seed_reference"] == "data-order"
    assert verdict.caveats[0] in content.notes(verdict)  # the report says it under the headline


def test_a_finetune_is_recognized_from_equal_step0_weights(study):
    """Without ``start`` in pair.json (an older writer) the weights say it: every pair's E(0) = 0."""
    pairs = [dataclasses.replace(p, start=None) for p in load_pairs([study])]
    assert recognize(pairs).how == FROM_WEIGHTS
    (verdict,) = analyze(pairs, n_boot=20).verdicts
    assert verdict.status == "bounded" and verdict.caveats[0].startswith(
        f"a fine-tune (recognized from {FROM_WEIGHTS})"
    )


def test_training_from_scratch_is_no_finetune():
    """A seed pair whose arms start from different weights (E_S(0) > 0) keeps the 0.1 rule."""
    pairs = [
        make_pair("flash", "optimization", 1e-4),
        make_pair("bf16", "precision", 1e-2),
        make_pair("seed", "seed", 1e-2, offset=0.5),
    ]
    assert recognize(pairs) is None
    assert analyze(pairs, n_boot=20).settings["fine_tune"] is None
    assert recognize([dataclasses.replace(p, start="x") for p in pairs]).how == FROM_START


def test_pair_json_start_is_optional(tmp_path):
    assert "start" not in write_pair_files(tmp_path / "scratch", max_steps=4)
    assert write_pair_files(tmp_path / "ft", max_steps=4, start="runs/pre/unet")["start"] == "runs/pre/unet"
    with pytest.raises(UserInputError, match="start=3: must be a non-empty string"):
        write_pair_files(tmp_path / "bad", max_steps=4, start=3)


def test_the_builtin_trainer_records_a_pretrained_denoiser_as_start():
    from divergence.config.schema import parse
    from divergence.recipe.run import RunRecipe
    from divergence.training.pair_setup import pretrained_start

    recipe = parse(RunRecipe, {"model": {"unet": {"path": "/pre/unet"}, "text_encoder": {"path": "/pre/te"}}})
    assert pretrained_start(recipe) == "model.unet.path=/pre/unet, model.text_encoder.path=/pre/te"
    frozen = parse(RunRecipe, {"model": {"text_encoder": {"path": "/pre/te", "train": False}}})
    assert pretrained_start(frozen) is None  # a frozen pretrained part on a fresh denoiser: from scratch
