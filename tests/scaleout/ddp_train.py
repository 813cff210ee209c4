"""``divergence train`` as one rank of a DDP job, optionally with one rank's loss poisoned.

Run as ``python -m tests.scaleout.ddp_train [--nan-on-rank R --nan-at-step S] -- <train args>``
by ``test_ddp_lockstep``, which starts the ranks itself (``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT``: Lightning joins them instead of launching its own).
"""

import os
import sys


def main(argv: list[str]) -> int:
    split = argv.index("--")
    options, train_args = argv[:split], argv[split + 1 :]
    if "--nan-on-rank" in options:
        rank = int(options[options.index("--nan-on-rank") + 1])
        step = int(options[options.index("--nan-at-step") + 1])
        if int(os.environ["LOCAL_RANK"]) == rank:
            poison(step)
    from divergence.cli import main as cli

    return cli(["train", *train_args])


def poison(step: int) -> None:
    """This rank reports a NaN loss for arm a's batch of step ``step`` (the other ranks do not)."""
    import torch

    from divergence.training import arm as arm_module

    original = arm_module.Arm.training_step

    def poisoned(self, inputs, **kwargs):
        out = original(self, inputs, **kwargs)
        if self.name.endswith(".a") and inputs.step == step:
            out.loss = torch.tensor(float("nan"))
        return out

    arm_module.Arm.training_step = poisoned


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
