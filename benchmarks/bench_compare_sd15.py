"""``compare_state_dicts`` on two SD-1.5-sized UNets vs serial ``np.sort`` of both sides, side by side.

    python benchmarks/bench_compare_sd15.py [--repeats 3] [--files] [--dir /tmp/divergence-sd15]
    python benchmarks/bench_compare_sd15.py --blocks 1      # a smaller UNet, for a quick look

Builds Stable Diffusion 1.5's UNet (``UNet2DConditionModel`` with the config of
``runwayml/stable-diffusion-v1-5/unet/config.json``, written out below; nothing is downloaded)
on the meta device, so no weights are initialized, then fills each of its 686 float32 tensors
(859.5M parameters, 3.4 GB a side) with ``torch.randn`` from a seeded generator:
a = randn, b = a + 1e-3 randn, two nearby weights as two arms of a pair are.

Then, in this process on the same tensors, alternating repeat by repeat after a burn-in so
that load from other processes falls on both alike (best of ``--repeats``):

    serial sort   ``np.sort`` of a's tensor, then of b's, tensor by tensor, on one thread:
                  the time W1's sorts alone take without any overlap;
    compare       ``divergence.checkpoints.compare.compare_state_dicts(a, b)``: every metric
                  of every tensor pair (W1 needs both sorts) and the summary.

and prints the ratio compare / serial sort (target: at most 1.0x). ``--files`` also writes
both sides as safetensors files and times ``compare_checkpoints`` on them, reading included
(the files were just written, so they are read from the page cache when memory allows).
Ratios, not absolute times, are the result: the machine may be shared.
"""

import argparse
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from divergence.checkpoints.compare import compare_checkpoints, compare_state_dicts

# runwayml/stable-diffusion-v1-5, unet/config.json (diffusers' defaults for the rest).
SD15_UNET = dict(
    sample_size=64,
    in_channels=4,
    out_channels=4,
    center_input_sample=False,
    flip_sin_to_cos=True,
    freq_shift=0,
    layers_per_block=2,
    downsample_padding=1,
    mid_block_scale_factor=1,
    act_fn="silu",
    norm_num_groups=32,
    norm_eps=1e-5,
    cross_attention_dim=768,
    attention_head_dim=8,
    block_out_channels=(320, 640, 1280, 1280),
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
)


def unet_shapes(blocks: int) -> dict[str, torch.Size]:
    """Names and shapes of SD 1.5's UNet state dict (its first ``blocks`` down and up block types)."""
    from diffusers import UNet2DConditionModel

    config = dict(SD15_UNET)
    if blocks < 4:  # a smaller UNet of the same kind, for a quick run
        config.update(
            block_out_channels=config["block_out_channels"][:blocks],
            down_block_types=config["down_block_types"][:blocks],
            up_block_types=config["up_block_types"][-blocks:],
        )
    with torch.device("meta"):  # shapes only: no memory, no initialization
        model = UNet2DConditionModel(**config)
    return {name: t.shape for name, t in model.state_dict().items()}


def nearby_weights(shapes: dict, seed: int = 0) -> tuple[dict, dict]:
    """a = randn, b = a + 1e-3 randn, tensor by tensor, from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    a, b = {}, {}
    for name, shape in shapes.items():
        a[name] = torch.randn(shape, generator=g)
        b[name] = a[name] + 1e-3 * torch.randn(shape, generator=g)
    return a, b


def serial_sort(a: dict, b: dict) -> None:
    for name in a:
        np.sort(a[name].reshape(-1).numpy())
        np.sort(b[name].reshape(-1).numpy())


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process: all its threads)."""
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


def report(what: str, times: list[tuple[float, float]]) -> None:
    """The best repeat's wall and CPU time (CPU / wall: the cores it kept busy), then every wall time."""
    wall, cpu = min(times)
    print(
        f"{what:<35} {wall:7.2f} s   CPU {cpu:6.2f} s = {cpu / wall:.2f} cores   "
        f"(all: {', '.join(f'{t:.2f}' for t, _ in times)})"
    )


def load_line() -> str:
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--blocks", type=int, default=4, choices=(1, 2, 3, 4), help="UNet blocks per side (4: SD 1.5 itself)"
    )
    parser.add_argument("--files", action="store_true", help="also compare two safetensors files, reading included")
    parser.add_argument("--dir", default="/tmp/divergence-sd15-bench", help="where --files writes (removed after)")
    args = parser.parse_args()

    a, b = nearby_weights(unet_shapes(args.blocks))
    numel = sum(t.numel() for t in a.values())
    print(
        f"two UNets: {len(a)} tensors, {numel / 1e6:,.1f}M float32 parameters ({numel * 4 / 2**30:.2f} GiB) a side; "
        f"{os.cpu_count()} cores, torch threads = {torch.get_num_threads()}; {load_line()}"
    )
    names = list(a)[:40]  # burn-in: pool threads started, allocator warm, on a slice of the model
    serial_sort({n: a[n] for n in names}, {n: b[n] for n in names})
    compare_state_dicts({n: a[n] for n in names}, {n: b[n] for n in names})

    t_sort, t_compare = [], []
    for _ in range(args.repeats):
        t_sort.append(timed(lambda: serial_sort(a, b)))
        t_compare.append(timed(lambda: compare_state_dicts(a, b)))
    sort, compare = min(t_sort), min(t_compare)
    report("serial np.sort of both sides", t_sort)
    report("compare_state_dicts(a, b)", t_compare)
    print(
        f"ratio compare / serial sort         {compare[0] / sort[0]:7.2f}x   (target <= 1.0x); "
        f"CPU time ratio {compare[1] / sort[1]:.2f}x; {load_line()}"
    )
    if args.files:
        compare_files(a, b, sort, args)


def compare_files(a: dict, b: dict, sort: tuple[float, float], args) -> None:
    """The same comparison on two safetensors files: ``compare_checkpoints`` opens and reads them."""
    from safetensors.torch import save_file

    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        save_file(a, folder / "a.safetensors")
        save_file(b, folder / "b.safetensors")
        a.clear(), b.clear()  # the files alone from here on
        paths = folder / "a.safetensors", folder / "b.safetensors"
        compare_checkpoints(*paths)  # burn-in
        files = [timed(lambda: compare_checkpoints(*paths)) for _ in range(args.repeats)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report("compare_checkpoints on the files", files)
    print(
        f"ratio files / serial sort           {min(files)[0] / sort[0]:7.2f}x   (reading included, page cache "
        f"warm); {load_line()}"
    )


if __name__ == "__main__":
    main()
