"""Writes ``tests/checkpoints/data/deepspeed/``: two ZeRO-2 save dirs written by DeepSpeed itself.

Not run by the suite (``deepspeed`` is not one of the project's dependencies: its sdist has no
``pyproject.toml`` and its ``setup.py`` imports torch, so pip's isolated build fails beside a CPU
torch). Made once, on a CPU, with deepspeed 0.19.8 installed beside the project's torch::

    DS_BUILD_OPS=0 pip install --no-build-isolation --no-deps deepspeed==0.19.8
    pip install hjson ninja py-cpuinfo msgpack einops
    python tests/checkpoints/make_deepspeed_fixture.py

Each arm (seed 1 and seed 2) trains a tiny MLP for 3 ZeRO-2 steps on 2 gloo ranks
(``DS_ACCELERATOR=cpu``) and calls ``engine.save_checkpoint``, which writes ``latest``,
``global_step3/mp_rank_00_model_states.pt`` and one ``zero_pp_rank_R_mp_rank_00_optim_states.pt``
per rank; rank 0 also saves the module's weights beside it (``a.safetensors``), the oracle the
test compares the DeepSpeed folders against. DeepSpeed's copied helper scripts (``zero_to_fp32.py``,
``zero_to_torch.py``) are removed: they are DeepSpeed's code, not checkpoint data.
"""

import os
import shutil
import sys
from pathlib import Path

import torch
import torch.multiprocessing as mp

OUT = Path(__file__).resolve().parent / "data" / "deepspeed"
STEPS = 3


def _arm(rank: int, world: int, seed: int, out: Path) -> None:
    os.environ.update(
        DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + seed), RANK=str(rank),
        WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_SIZE=str(world),
    )  # fmt: skip
    import deepspeed
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    config = {
        "train_batch_size": 4 * world,
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 2},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        loss = engine(torch.randn(4, 8, generator=data)).square().mean()
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(str(out))
    if rank == 0:
        save_file(
            {k: v.contiguous() for k, v in engine.module.state_dict().items()},
            str(out.parent / f"{out.name}.safetensors"),
        )
        for helper in ("zero_to_fp32.py", "zero_to_torch.py"):
            (out / helper).unlink(missing_ok=True)


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    for seed, arm in ((1, "a"), (2, "b")):
        mp.spawn(_arm, args=(2, seed, OUT / arm), nprocs=2, join=True)
    print("\n".join(str(p.relative_to(OUT)) for p in sorted(OUT.rglob("*")) if p.is_file()), file=sys.stderr)


if __name__ == "__main__":
    main()
