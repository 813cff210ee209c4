"""Two arms of a plain PyTorch loop as two processes, written with ``ArmWriter``; ``divergence watch`` follows.

The arms differ in one thing: arm a's AdamW runs its multi-tensor ``foreach`` implementation,
arm b the single-kernel ``fused`` one (the same math in another operation order; on the CPU
the per-tensor loop matches ``foreach`` bit for bit, ``fused`` does not). Each arm is its own
process, as it would be its own job on a cluster; the watcher builds the pair's metrics store
while they train.

    python examples/plain_loop.py --out runs/adamw-foreach-vs-fused --steps 40
    python examples/plain_loop.py --arm a --out DIR     # one arm alone (what the launcher runs)
"""

import argparse
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

import divergence
from divergence.data.shapes import ShapesDataset
from divergence.writers import write_pair_files


def train_arm(arm: str, out: str, steps: int, every: int) -> None:
    torch.manual_seed(0)  # the same initial weights in both arms
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GELU(), torch.nn.Conv2d(8, 3, 3, padding=1)
    )
    kernel = {"a": "foreach", "b": "fused"}[arm]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, **{kernel: True})
    images = ShapesDataset(seed=0, num_examples=64, resolution=16)
    data = torch.stack(
        [
            torch.from_numpy(np.asarray(images[i][0], dtype=np.float32) / 255).permute(2, 0, 1)
            for i in range(len(images))
        ]
    )  # (64, 3, 16, 16)
    noise = torch.Generator().manual_seed(1)  # the same noise in both arms

    writer = divergence.ArmWriter(out, arm, max_steps=steps, every=every)  # pair.json: written by main
    writer.record(0, model)  # the initial weights
    with writer:  # marks the arm finished (or failed, on an exception) at the end
        for step in range(1, steps + 1):
            batch = data[(step * 8) % 64 :][:8]
            noisy = batch + 0.3 * torch.randn(batch.shape, generator=noise)
            loss = F.mse_loss(model(noisy), batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            writer.record(step, model, loss)  # the loss; the weights at tracked steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/adamw-foreach-vs-fused")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--arm", choices=("a", "b"), help="train this arm only")
    args = parser.parse_args(argv)
    if args.arm:
        train_arm(args.arm, args.out, args.steps, args.every)
        return 0
    # what the pair is (the arms would write a minimal pair.json themselves; watch needs it first)
    write_pair_files(
        args.out,
        max_steps=args.steps,
        every=args.every,
        name="adamw-foreach-vs-fused",
        arms={"a": ["adamw=foreach"], "b": ["adamw=fused"]},
        log={"wandb": False},
    )  # CSV logs only
    common = ["--out", args.out, "--steps", str(args.steps), "--every", str(args.every)]
    jobs = [subprocess.Popen([sys.executable, __file__, "--arm", arm, *common]) for arm in ("a", "b")]
    from divergence.cli import main as divergence_cli

    code = divergence_cli(["watch", args.out, "--poll", "0.2", "--timeout", "120", "--quiet"])
    if any(job.wait() != 0 for job in jobs) or code != 0:
        return 1
    return 0  # watch has printed the result and the next command


if __name__ == "__main__":
    sys.exit(main())
