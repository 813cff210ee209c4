"""The comparator on several ranks: time and peak memory per rank, against one rank.

    python benchmarks/bench_comparator.py [--mb 400] [--tensor-mb 32] [--ranks 2] [--dir /tmp/div-ranks]

Writes two safetensors checkpoints of --mb MB each (tensors of --tensor-mb MB and smaller),
compares them with ``divergence.comparator.distributed.compare_files`` on 1 and on --ranks
gloo ranks (CPU processes), checks the results are identical, and prints each run's wall
time and every rank's peak resident memory over its baseline after imports.
"""

import argparse
import pickle
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import save_file


def write_pair(folder: Path, mb: int, tensor_mb: int) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    sizes, left = [], mb * 2**20 // 4
    while left > 0:  # a model-like mix: one big tensor in four, the rest an eighth of it
        n = min(left, tensor_mb * 2**20 // 4 // (1 if len(sizes) % 4 == 0 else 8))
        sizes.append(n)
        left -= n
    a = {f"blocks.{i}.weight": torch.randn(n, generator=g) for i, n in enumerate(sizes)}
    save_file(a, folder / "a.safetensors")
    save_file({k: v + 1e-3 * torch.randn(v.shape, generator=g) for k, v in a.items()}, folder / "b.safetensors")
    return folder / "a.safetensors", folder / "b.safetensors"


def rank_main(rank: int, world_size: int, init: str, a: str, b: str, out: str) -> None:
    from divergence.comparator.distributed import compare_files
    from divergence.comparator.distributed import ProcessGroupRanks, Ranks

    torch.set_num_threads(1)
    if world_size > 1:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)
    ranks = ProcessGroupRanks() if world_size > 1 else Ranks()
    import divergence.metrics  # noqa: F401  (the baseline includes every import)

    base = _peak_rss_kib()
    compare_files(a, b, ranks)  # burn-in: page cache, lazy imports
    start = time.perf_counter()
    result = compare_files(a, b, ranks)
    seconds = time.perf_counter() - start
    peak = _peak_rss_kib()
    stats = ranks.gather((rank, seconds, (peak - base) / 1024, peak / 1024))
    if rank == 0:
        Path(out).write_bytes(pickle.dumps((result.records, stats)))
    ranks.close()


def _peak_rss_kib() -> int:
    """This process's peak resident memory (VmHWM). Not getrusage: a spawned child's ru_maxrss
    starts at its parent's peak (the counter survives exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def run(world_size: int, a: Path, b: Path, tmp: Path):
    out, init = tmp / f"result-{world_size}.pkl", f"file://{tmp}/rendezvous-{world_size}"
    mp.spawn(rank_main, args=(world_size, init, str(a), str(b), str(out)), nprocs=world_size, join=True)
    return pickle.loads(out.read_bytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=400)
    parser.add_argument("--tensor-mb", type=int, default=32)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    tmp = Path(args.dir or tempfile.mkdtemp(prefix="div-ranks-"))
    try:
        a, b = write_pair(tmp, args.mb, args.tensor_mb)
        print(f"checkpoints: 2 x {args.mb} MB, largest tensor {args.tensor_mb} MB")
        single, single_stats = run(1, a, b, tmp)
        many, many_stats = run(args.ranks, a, b, tmp)
        print(f"{args.ranks} ranks equal 1 rank exactly: {many == single}")
        for label, stats in (("1 rank", single_stats), (f"{args.ranks} ranks", many_stats)):
            wall = max(s[1] for s in stats)
            ranks = ", ".join(f"rank {r}: +{d:.0f} MiB (peak {p:.0f} MiB)" for r, _, d, p in stats)
            print(f"{label}: {wall:.2f} s ({2 * args.mb / wall:.0f} MB/s of checkpoint read); {ranks}")
    finally:
        if args.dir is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
