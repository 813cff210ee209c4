"""Both arms of a pair in one plain PyTorch loop, compared in memory with ``divergence.Pair``; then the report.

No Lightning, no second process, no weights files: each step trains both models on the same batch,
and ``pair.record(step, loss_a, loss_b)`` compares their weights where they are at the tracked steps
(step 0, every ``--every`` steps, the denser early schedule and the last). Two pairs of a small MLP,
from the same initial weights and batches, into one runs folder:

- ``adamw-fused-vs-foreach`` (the pair under study): AdamW's single-kernel ``fused`` implementation
  against its multi-tensor ``foreach`` one, the same math in another operation order;
- ``bf16-vs-fp32`` (the precision pair, the reference dose): arm a under bf16 autocast, arm b fp32.

``divergence.build_report`` then reads the folder. A verdict needs more pairs beside these (a seed
pair, a control, a reordering pair, 3 replicates each); the report says which are missing.

    python examples/plain_pair.py --out runs/plain-pair --steps 60
"""

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

import divergence

# name: (category, the arms' labels, arm a's (bf16 autocast, AdamW kernel), arm b's)
PAIRS = {
    "adamw-fused-vs-foreach": (
        "optimization",
        {"a": ["adamw=fused"], "b": ["adamw=foreach"]},
        (False, "fused"),
        (False, "foreach"),
    ),
    "bf16-vs-fp32": (
        "precision",
        {"a": ["precision=bf16-autocast"], "b": ["precision=fp32"]},
        (True, "foreach"),
        (False, "foreach"),
    ),
}


def data(count: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """The example's own data: ``count`` inputs of 8 features and a smooth target of 4, from seed 0."""
    draw = torch.Generator().manual_seed(0)
    x = torch.randn(count, 8, generator=draw)
    y = torch.sin(x @ torch.randn(8, 4, generator=draw))
    return x, y


def model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights in both arms
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def train_step(net, optimizer, x, y, bf16: bool) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = F.mse_loss(net(x).float(), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach()


def train_pair(out: Path, name: str, steps: int, every: int) -> None:
    category, labels, *arms = PAIRS[name]
    models = [model() for _ in arms]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2, **{kernel: True}) for m, (_, kernel) in zip(models, arms)]
    x, y = data()
    pair = divergence.Pair(out, *models, max_steps=steps, every=every, name=name, category=category, arms=labels)
    with pair:  # step 0 (the initial weights) is recorded at Pair(...); pair.json says finished at the end
        for step in range(1, steps + 1):
            rows = torch.arange(step * 32, step * 32 + 32) % len(x)  # the step's batch, the same in both arms
            losses = [train_step(m, o, x[rows], y[rows], bf16) for m, o, (bf16, _) in zip(models, optimizers, arms)]
            pair.record(step, *losses)  # the losses; the weights compared at tracked steps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/plain-pair")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args(argv)
    runs = Path(args.out)
    for name in PAIRS:
        train_pair(runs / name, name, args.steps, args.every)
    report = divergence.build_report([runs], runs / "report")
    print(f"{runs}: {len(PAIRS)} pairs; the report: {report.out / 'report.html'}")
    return report


if __name__ == "__main__":
    main()
