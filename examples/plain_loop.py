"""Two arms of a plain PyTorch loop as two processes, written with ``ArmWriter``; ``divergence.watch`` follows.

The arms differ in one thing: arm a's AdamW runs its multi-tensor ``foreach`` implementation,
arm b the single-kernel ``fused`` one (the same math in another operation order; on the CPU
the per-tensor loop matches ``foreach`` bit for bit, ``fused`` does not). Each arm is its own
process, as it would be its own job on a cluster; ``divergence.watch`` (``divergence watch`` as a
function) builds the pair's metrics store while they train. The data is the example's own: small
synthetic images, denoised by a two-layer convolutional net.

    python examples/plain_loop.py --out runs/adamw-foreach-vs-fused --steps 40
    python examples/plain_loop.py --arm a --out DIR     # one arm alone (what the launcher runs)
"""

import argparse
import subprocess
import sys

import torch
import torch.nn.functional as F

import divergence
from divergence.writers import write_pair_files


def images(count: int = 64, size: int = 16) -> torch.Tensor:
    """The example's own data: ``count`` RGB images of a bright square on a dark background, its
    place, size and colour drawn from seed 0, (count, 3, size, size) in [0, 1]."""
    draw = torch.Generator().manual_seed(0)
    data = torch.full((count, 3, size, size), 0.1)
    for image in data:
        side = int(torch.randint(3, size // 2, (1,), generator=draw))
        top, left = torch.randint(0, size - side, (2,), generator=draw).tolist()
        image[:, top : top + side, left : left + side] = torch.rand(3, 1, 1, generator=draw)
    return data


def train_arm(arm: str, out: str, steps: int, every: int) -> None:
    torch.manual_seed(0)  # the same initial weights in both arms
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GELU(), torch.nn.Conv2d(8, 3, 3, padding=1)
    )
    kernel = {"a": "foreach", "b": "fused"}[arm]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, **{kernel: True})
    data = images()  # (64, 3, 16, 16), the same in both arms
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
    result = divergence.watch(args.out, poll=0.2, timeout=120, quiet=True)  # prints the result and the next command
    if any(job.wait() != 0 for job in jobs) or not result.complete:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
