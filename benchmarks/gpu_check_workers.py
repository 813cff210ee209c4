"""The in-process measurements of ``gpu_check.py``: each runs in its own subprocess and writes
one JSON file. Library calls, not the CLI, because they time pieces the CLI does not expose.

    python3 benchmarks/gpu_check_workers.py wasserstein OUT.json [--sizes 1e8 1e9] [--cpu-size 1e7]
    python3 benchmarks/gpu_check_workers.py sd15 OUT.json [--batch 4] [--steps 6]

Timings follow nanoGPT's bench.py: a burn-in, then a timed stage bracketed by
``torch.cuda.synchronize()``; peak memory is ``torch.cuda.max_memory_allocated`` after a reset.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The random-weight, no-download SD-1.5 setup documented at the top of recipes/sd15.yaml.
SD15_RANDOM = [
    "model.tokenizer.kind=bytes",
    "model.text_encoder.path=null",
    "model.text_encoder.hidden_size=768",
    "model.text_encoder.num_layers=12",
    "model.text_encoder.num_heads=12",
    "model.text_encoder.intermediate_size=3072",
    "model.vae.path=null",
    "data.source=shapes",
    "data.path=null",
    "log.wandb=false",
]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _sync():
    import torch

    if _cuda():
        torch.cuda.synchronize()


def _timed(fn, repeats: int = 1) -> float:
    """Seconds per call of ``fn`` (device-synchronized)."""
    _sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync()
    return (time.perf_counter() - start) / repeats


def _peak(fn) -> tuple[float, float]:
    """``(seconds, peak GiB allocated)`` of one call of ``fn``, measured from a fresh peak
    (NaN GiB off CUDA: the CPU smoke test of these workers)."""
    import torch

    if not _cuda():
        return _timed(fn), float("nan")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    seconds = _timed(fn)
    return seconds, torch.cuda.max_memory_allocated() / 2**30


def wasserstein_part(sizes: list[int], cpu_size: int, device: str = "cuda") -> dict:
    """W1 of two nearby fp32 tensors on the GPU at each size; the CPU path at ``cpu_size``,
    extrapolated linearly per element (a lower bound: the CPU sort is O(n log n))."""
    import torch

    from divergence.metrics import wasserstein

    g = torch.Generator().manual_seed(0)
    a = torch.randn(cpu_size, generator=g)
    b = a + 1e-3 * torch.randn(cpu_size, generator=g)
    wasserstein(a[:1000], b[:1000])
    start = time.perf_counter()
    cpu_value = wasserstein(a, b)
    cpu_s = time.perf_counter() - start
    out = {"cpu": {"n": cpu_size, "seconds": cpu_s, "value": cpu_value, "threads": torch.get_num_threads()}, "gpu": []}
    del a, b
    for n in sizes:
        row = {"n": n, "cpu_extrapolated_s": cpu_s * n / cpu_size}
        try:
            gen = torch.Generator(device=device).manual_seed(0)
            da = torch.randn(n, generator=gen, device=device)
            db = da + 1e-3 * torch.randn(n, generator=gen, device=device)
            wasserstein(da[:1000], db[:1000])  # burn-in
            base = torch.cuda.memory_allocated() / 2**30 if _cuda() else float("nan")
            seconds, peak = _peak(lambda row=row, da=da, db=db: row.update(value=wasserstein(da, db)))
            row.update(
                seconds=seconds, peak_gib=peak, inputs_gib=base, speedup_vs_cpu=row["cpu_extrapolated_s"] / seconds
            )
            del da, db
        except RuntimeError as err:  # out of memory at 1e9 is a result, not a crash
            row["error"] = str(err).strip().splitlines()[0]
        if _cuda():
            torch.cuda.empty_cache()
        out["gpu"].append(row)
    return out


def sd15_part(
    batch: int, steps: int, device: str = "cuda", recipe_path: Path | None = None, overrides: list[str] = SD15_RANDOM
) -> dict:
    """One arm and a lockstep pair of the SD-1.5-sized recipe (random weights, latents encoded
    once before timing): step time and peak memory; the tracking overhead at every k is
    ``1 + t_compare / (k * t_pair_step)`` from the measured time of one whole-model comparison."""
    import torch

    from divergence.recipe.run import load_run_recipe
    from divergence.training.arm import Arm
    from divergence.training.inputs import Inputs
    from divergence.tracking.records import divergence_records

    recipe = load_run_recipe(
        recipe_path or ROOT / "recipes" / "sd15.yaml", list(overrides) + [f"train.batch_size={batch}"]
    )
    device = torch.device(device)
    inputs = Inputs(recipe).to(device)
    latents = [inputs.prepare(inputs.batches.batch(s).to(device)) for s in range(4)]  # synthetic latents
    arms = {}
    for name in "ab":
        arm = Arm(recipe, inputs.tokenizer, name=name).to(device)
        arm.setup(device)
        arm.configure_optimizers()
        arms[name] = arm
    params = sum(p.numel() for p in arms["a"].trainable_parameters())
    state = {"step": 0}

    def one(names):
        x = latents[state["step"] % len(latents)]
        state["step"] += 1
        for n in names:
            arms[n].training_step(x)

    def stage(names):
        def run():
            for _ in range(steps):
                one(names)

        seconds, peak = _peak(run)
        return {"step_s": seconds / steps, "peak_gib": peak}

    one("ab")  # burn-in (cuDNN autotune, allocator)
    result = {
        "params": params,
        "batch": batch,
        "resolution": recipe.data.resolution,
        "steps": steps,
        "precision": recipe.train.precision,
        "one_arm": stage("a"),
        "pair": stage("ab"),
    }
    track_s, track_peak = _peak(lambda: divergence_records(arms["a"].weights(), arms["b"].weights(), device))
    pair_s = result["pair"]["step_s"]
    result["pair_over_two_arms"] = pair_s / (2 * result["one_arm"]["step_s"])
    result["compare_s"] = track_s
    result["compare_peak_gib"] = track_peak
    # Wall time of pair steps with a comparison every k steps over pair steps without tracking.
    result["tracking_overhead_every_10"] = 1 + track_s / (10 * pair_s)
    result["tracking_overhead_every_1"] = 1 + track_s / pair_s
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("wasserstein", "sd15"))
    p.add_argument("out", help="JSON file to write")
    p.add_argument("--sizes", nargs="+", type=float, default=[1e8, 1e9])
    p.add_argument("--cpu-size", type=float, default=1e7)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--device", default="cuda", help="cuda; cpu only to smoke-test this script")
    p.add_argument(
        "--recipe", type=Path, help="run recipe of the sd15 part (default recipes/sd15.yaml, random weights)"
    )
    args = p.parse_args(argv)
    if args.part == "wasserstein":
        result = wasserstein_part([int(s) for s in args.sizes], int(args.cpu_size), args.device)
    elif args.recipe:
        result = sd15_part(args.batch, args.steps, args.device, args.recipe, ["log.wandb=false"])
    else:
        result = sd15_part(args.batch, args.steps, args.device)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
