"""The fine-tuning ceiling, measured (docs/method.md, "Fine-tuning").

The tiny diffusion model of ``recipes/tiny.yaml``, pretrained (``divergence train --out PRE
--max-steps N``), fine-tuned from ``PRE/checkpoints/step_<N>.safetensors`` by three arms in one
process, each with the built-in trainer's ``Arm`` and its own inputs:

    ref      fp32, data seed 0           (the reference arm b of every pair)
    order    fp32, data seed 1           (data order and noise changed: the data-order seed pair)
    bf16     bf16-mixed, data seed 0     (the precision pair)

Printed per step: E of each pair (whole-model ||theta_a - theta_b|| / ||theta_b||, the store's
rel_l2) and each arm's displacement from the start D = ||theta_t - theta_0|| / ||theta_0||, the two
candidate ceilings.

    python benchmarks/finetune_ceiling.py PRE/checkpoints/step_000300.safetensors --steps 40 --lr 1e-4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
from safetensors.torch import load_file

from divergence.recipe.run import RunRecipe
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs

ARMS = {
    "ref": {"precision": "32-true", "seed": 0, "attention": "sdpa"},
    "order": {"precision": "32-true", "seed": 1, "attention": "sdpa"},
    "bf16": {"precision": "bf16-mixed", "seed": 0, "attention": "sdpa"},
}
PAIRS = {"order": ("order", "ref"), "bf16": ("bf16", "ref")}


def arm_recipe(base: RunRecipe, spec: dict, lr: float) -> RunRecipe:
    train = dataclasses.replace(base.train, precision=spec["precision"], lr=lr)
    data = dataclasses.replace(base.data, seed=spec["seed"])
    attention = dataclasses.replace(base.attention, name=spec["attention"])
    return dataclasses.replace(base, train=train, data=data, attention=attention)


def flat(arm: Arm) -> torch.Tensor:
    return torch.cat([v.detach().float().flatten() for v in arm.weights().values()])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("start")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = load_file(args.start)
    base = RunRecipe()
    arms, inputs = {}, {}
    for name, spec in ARMS.items():
        recipe = arm_recipe(base, spec, args.lr)
        inputs[name] = Inputs(recipe)
        arm = Arm(recipe, inputs[name].tokenizer, name=name)
        arm.load_state_dict({k: v for k, v in start.items() if not k.startswith("ema.")}, strict=False)
        arm.setup(torch.device("cpu"))
        arm.configure_optimizers()
        arms[name] = arm
    theta0 = {n: flat(a) for n, a in arms.items()}
    t0 = time.time()
    for step in range(1, args.steps + 1):
        for name, arm in arms.items():
            batch = inputs[name].batches.batch(step - 1)
            arm.training_step(inputs[name].prepare_step(batch))
        theta = {n: flat(a) for n, a in arms.items()}
        row = {"step": step, "seconds": round(time.time() - t0, 1)}
        row.update({f"E_{p}": rel(theta[a], theta[b]) for p, (a, b) in PAIRS.items()})
        row.update({f"D_{n}": rel(theta[n], theta0[n]) for n in arms})
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
