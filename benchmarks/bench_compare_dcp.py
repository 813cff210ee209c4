"""DCP checkpoints against the same weights as safetensors: peak memory and time of ``compare``.

    python benchmarks/bench_compare_dcp.py [--tensor-mb 256] [--repeats 3] [--dir /tmp/div-dcp]

Two arms of a model with one large tensor (an Embedding of --tensor-mb MiB, float32) and a
few small ones are sharded with FSDP2 over 2 CPU ranks (gloo) and saved with the real
``torch.distributed.checkpoint.save`` (the large tensor in 2 chunks, one per rank), and the
same full weights as safetensors. Printed side by side, measured in one run:

- peak resident memory of ``divergence compare`` in a child process (its VmHWM), above the
  interpreter + torch baseline, in units of the largest tensor, for DCP and safetensors;
- the time of ``compare_checkpoints`` in this process, DCP and safetensors alternating,
  the median of --repeats each, and their ratio (the acceptance: DCP within 1.2x), with the
  fastest runs' ratio beside it (on a busy machine the least disturbed runs say more);
- the time of the readers alone (every tensor of one checkpoint loaded), fastest of --repeats.
"""

import argparse
import os
import shutil
import socket
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare_memory import peak_rss_of  # noqa: E402  (the same child-process peak)


def _model(rows: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(rows, 1024), torch.nn.Linear(1024, 64), torch.nn.Linear(64, 8))


def _worker(rank: int, world: int, root: str, rows: int, port: int) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for arm, seed in (("a", 0), ("b", 1)):
        model = _model(rows, 0)
        with torch.no_grad():  # arm b: the same weights nudged, as after a differing step
            g = torch.Generator().manual_seed(seed)
            for p in model.parameters():
                p.add_(1e-3 * seed * torch.randn(p.shape, generator=g))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        dcp.save({"model": model.state_dict()}, checkpoint_id=Path(root) / "dcp" / arm)
        full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}
        if rank == 0:
            (Path(root) / "st").mkdir(parents=True, exist_ok=True)
            save_file({k: v.detach().contiguous() for k, v in full.items()}, Path(root) / "st" / f"{arm}.safetensors")
        del full, model
    dist.destroy_process_group()


def write(root: Path, tensor_mb: int) -> None:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, str(root), tensor_mb * 2**20 // 4 // 1024, port), nprocs=2, join=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensor-mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/divergence-dcp-bench")
    args = parser.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    try:
        write(root / "tiny", 1)
        write(root / "big", args.tensor_mb)
        print(f"model: one {args.tensor_mb} MiB float32 tensor (2 DCP chunks, one per rank) + 2 small ones")
        report_memory(root, args.tensor_mb)
        report_time(root / "big", args.repeats)
        report_reads(root / "big", args.repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _pairs(root: Path) -> dict[str, list[str]]:
    return {
        "dcp": [str(root / "dcp" / "a"), str(root / "dcp" / "b")],
        "safetensors": [str(root / "st" / "a.safetensors"), str(root / "st" / "b.safetensors")],
    }


def report_memory(root: Path, tensor_mb: int) -> None:
    cli = ["compare", "--quiet", "--top", "3", "--device", "cpu"]
    base, _ = peak_rss_of(cli + _pairs(root / "tiny")["safetensors"])
    print(f"peak RSS, tiny pair (interpreter + torch): {base:8,.0f} MiB")
    above = {}
    for name, pair in _pairs(root / "big").items():
        peak, _ = peak_rss_of(cli + pair)
        above[name] = peak - base
        print(
            f"peak RSS, {name:<11}                    {peak:8,.0f} MiB: {peak - base:,.0f} MiB above baseline "
            f"= {(peak - base) / tensor_mb:.2f} x the largest tensor"
        )
    print(f"  dcp / safetensors, above baseline: {above['dcp'] / above['safetensors']:.2f}")


def report_time(root: Path, repeats: int) -> None:
    from divergence.checkpoints.compare import compare_checkpoints

    seconds = {name: [] for name in _pairs(root)}
    compare_checkpoints(*_pairs(root)["safetensors"])  # warm the thread pool and the page cache
    compare_checkpoints(*_pairs(root)["dcp"])
    for _ in range(repeats):
        for name, pair in _pairs(root).items():
            start = time.perf_counter()
            compare_checkpoints(*pair)
            seconds[name].append(time.perf_counter() - start)
    median = {name: statistics.median(s) for name, s in seconds.items()}
    for name, s in seconds.items():
        print(
            f"compare_checkpoints, {name:<11}  median {median[name]:.3f} s  (runs: {', '.join(f'{x:.3f}' for x in s)})"
        )
    print(f"  dcp / safetensors time: {median['dcp'] / median['safetensors']:.2f} (acceptance: <= 1.2)")
    fastest = {name: min(s) for name, s in seconds.items()}
    print(
        f"  fastest runs' ratio: {fastest['dcp'] / fastest['safetensors']:.2f} (the least disturbed, on a busy machine)"
    )


def report_reads(root: Path, repeats: int) -> None:
    """The readers alone: every tensor of checkpoint A loaded, DCP and safetensors alternating."""
    from divergence.checkpoints import open_checkpoint

    seconds = {name: [] for name in _pairs(root)}
    for _ in range(repeats + 1):
        for name, pair in _pairs(root).items():
            source = open_checkpoint(pair[0])
            start = time.perf_counter()
            for tensor in source.names:
                source.load(tensor)
            seconds[name].append(time.perf_counter() - start)
    fastest = {name: min(s[1:]) for name, s in seconds.items()}  # the first: page cache warming
    print(
        f"reading A's tensors, fastest of {repeats}: dcp {fastest['dcp']:.3f} s, safetensors "
        f"{fastest['safetensors']:.3f} s, ratio {fastest['dcp'] / fastest['safetensors']:.2f}"
    )


if __name__ == "__main__":
    main()
