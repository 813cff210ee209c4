"""Bug or noise in one step: your change's gradient against a reordering of your baseline's sums.

Three code paths of one training step of a small MLP, each computing the gradient on the same weights
and batch: the baseline (one process, the whole batch), data parallel over 2 emulated ranks (each rank's
gradient on its half, averaged as the all-reduce does) and the same with one parameter left out of the
all-reduce (a known DDP bug). ``divergence.one_step_check`` states each change against the baseline's
gradient with its sums reordered (the batch split into 2, 4 and 8 micro-batches, summed last to first):

    python examples/one_step_check.py
    divergence check step examples/one_step_check.py:two_ranks examples/one_step_check.py:baseline \\
        --setup examples/one_step_check.py:setup        # reordering-like, exit 0
    divergence check step examples/one_step_check.py:two_ranks_one_left_out \\
        examples/one_step_check.py:baseline --setup examples/one_step_check.py:setup   # beyond, exit 1
"""

import torch
import torch.nn.functional as F

import divergence


def setup():
    """The model and one batch: (model, (inputs (32, 16), targets (32, 4)))."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    inputs = torch.randn(32, 16)
    return model, (inputs, inputs[:, :4].sin())


def baseline(model, batch):
    inputs, targets = batch
    F.mse_loss(model(inputs), targets).backward()  # the mean over the batch's examples


def two_ranks(model, batch, left_out: str | None = None):
    """Data parallel over 2 ranks: each rank's mean gradient on its half, averaged (DDP's all-reduce)."""
    grads = []
    for inputs, targets in zip(*(t.chunk(2) for t in batch)):
        model.zero_grad(set_to_none=True)
        F.mse_loss(model(inputs), targets).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    return {n: grads[0][n] if n == left_out else (grads[0][n] + grads[1][n]) / 2 for n in grads[0]}


def two_ranks_one_left_out(model, batch):
    """The bug: the last layer's bias keeps rank 0's own gradient."""
    return two_ranks(model, batch, left_out="2.bias")


def main() -> dict:
    model, batch = setup()
    results = {}
    for name, change in (("two_ranks", two_ranks), ("two_ranks_one_left_out", two_ranks_one_left_out)):
        results[name] = divergence.one_step_check(change, baseline, model, batch)
        print(f"{name}: {results[name].line()}")
    return results


if __name__ == "__main__":
    main()
