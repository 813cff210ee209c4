"""The one-step check: a change's gradient against a reordering of the baseline's sums (analysis.one_step),
on a small MLP and on the bug zoo's tiny GPT-2 cases that show in one step."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from divergence.analysis.one_step import one_step_check, split_batch
from divergence.errors import UserInputError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import zoo_cases  # noqa: E402


def _mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    x = torch.randn(16, 8)
    return model, (x, x[:, :2].cos())


def _base(model, batch):
    F.mse_loss(model(batch[0]), batch[1]).backward()


def test_identical_paths_are_reordering_like_bit_for_bit():
    model, batch = _mlp()
    result = one_step_check(_base, _base, model, batch)
    assert result.status == "reordering_like" and result.log10_ratio is None and result.e_change == 0


def test_a_scaled_gradient_is_beyond_and_the_weights_are_put_back():
    model, batch = _mlp()
    before = [p.detach().clone() for p in model.parameters()]

    def scaled(model, batch):  # one rank's gradient x (1 + 1e-3), averaged over 2: the whole gradient x (1 + 5e-4)
        _base(model, batch)
        return {n: p.grad * (1 + 5e-4) for n, p in model.named_parameters()}

    result = one_step_check(scaled, _base, model, batch)
    assert result.status == "beyond_reordering" and result.lo > 1.0
    assert [r["reference"] for r in result.references] == ["2 micro-batches", "4 micro-batches", "8 micro-batches"]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_split_batch_keeps_rows_together_and_non_tensors():
    parts = split_batch({"x": torch.arange(5), "n": 3, "t": (torch.arange(5) * 2,)}, 2)
    assert [p["x"].tolist() for p in parts] == [[0, 1, 2], [3, 4]]
    assert parts[1]["t"][0].tolist() == [6, 8] and parts[0]["n"] == 3


@pytest.mark.parametrize(
    "returns, message",
    [
        (lambda m, b: {"0.weight": torch.zeros(1)}, "tensor '0.weight' has shape (1,)"),
        (lambda m, b: {"0.bias": torch.full((32,), float("nan"))}, "'0.bias' is not finite"),
        (lambda m, b: 3.0, "returned float"),
    ],
)
def test_a_path_that_returns_the_wrong_thing_is_one_line(returns, message):
    model, batch = _mlp()

    def change(model, batch):
        _base(model, batch)
        out = returns(model, batch)
        if isinstance(out, dict):
            grads = {n: p.grad for n, p in model.named_parameters()}
            return {**grads, **out}
        return out

    with pytest.raises(UserInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        one_step_check(change, _base, model, batch)


def test_an_update_needs_its_reordered_reference():
    model, batch = _mlp()
    with pytest.raises(UserInputError, match="kind='update': give reordered="):
        one_step_check(_base, _base, model, batch, kind="update")


ONE_STEP = [c for c in zoo_cases.CASES if c.one_step]


@pytest.mark.parametrize("case", ONE_STEP, ids=[c.name for c in ONE_STEP])
def test_the_zoo_cases_that_show_in_one_step(case):
    """Every bug that shows in one step reads beyond reordering, every legitimate change reordering-like,
    each in seconds (the seconds are the check's own, a few forward and backward passes)."""
    result = one_step_check(**zoo_cases.one_step_args(case))
    assert result.status == ("beyond_reordering" if case.bug else "reordering_like"), result.line()
    if case.bug:
        assert result.lo > 3.0  # at least 1000x a reordering
    # torch-compile's seconds hold inductor's first compile of the model (38 s alone on 2 quiet cores, its cache
    # cold, as in a fresh CI machine's run): its own bound
    assert result.seconds < (300 if case.arm.compile else 60)


def test_bugs_that_show_only_across_steps_are_invisible_in_one_step():
    case = next(c for c in zoo_cases.CASES if c.name == "resume-without-scheduler")
    assert one_step_check(**zoo_cases.one_step_args(case)).e_change == 0.0
