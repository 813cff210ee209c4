"""Peak memory of ``divergence compare`` on two large checkpoints: about two tensors, not two models.

    python benchmarks/bench_compare_memory.py [--gb 5] [--tensor-mb 256] [--dir /tmp/div-mem]

Writes two safetensors checkpoints of --gb GB each (tensors of --tensor-mb MB), runs
``divergence compare`` on them in a child process, and prints the child's peak resident
memory beside the checkpoint size, the largest tensor, and the same command's peak on a
tiny pair (the interpreter + torch baseline).
"""

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_pair(folder: Path, gb: float, tensor_mb: int) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    per_tensor = tensor_mb * 2**20 // 4
    count = max(1, int(gb * 2**30 / (tensor_mb * 2**20)))
    g = torch.Generator().manual_seed(0)
    a = {f"layers.{i}.weight": torch.randn(per_tensor, generator=g) for i in range(count)}
    save_file(a, folder / "a.safetensors")
    b = {k: v.add_(1e-3 * torch.randn(per_tensor, generator=g)) for k, v in a.items()}
    save_file(b, folder / "b.safetensors")
    return folder / "a.safetensors", folder / "b.safetensors"


# The child reports its own peak (VmHWM of its fresh address space). getrusage's ru_maxrss
# of a child would also count the moment between fork and exec, when the child still maps
# this process's memory (here, the tensors it just wrote).
CHILD = """
import sys
from divergence.cli import main
code = main(sys.argv[1:])
hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))
print(int(hwm.split()[1]) / 1024, file=sys.stderr)
sys.exit(code)
"""


def peak_rss_of(args: list[str]) -> tuple[float, float]:
    """(peak RSS in MiB, seconds) of ``divergence ARGS`` in a child process."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    return float(done.stderr.strip().splitlines()[-1]), time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=5.0)
    parser.add_argument("--tensor-mb", type=int, default=256)
    parser.add_argument("--dir", default="/tmp/divergence-memory-bench")
    args = parser.parse_args()
    folder = Path(args.dir)
    cli = ["compare", "--quiet", "--top", "3"]
    try:
        tiny = write_pair(folder / "tiny", 0.001, 1)
        base, _ = peak_rss_of(cli + [str(p) for p in tiny])
        big = write_pair(folder / "big", args.gb, args.tensor_mb)
        peak, seconds = peak_rss_of(cli + [str(p) for p in big])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    size = args.gb * 1024
    print(f"checkpoints: 2 x {size:,.0f} MiB, largest tensor {args.tensor_mb} MiB")
    print(f"peak RSS, tiny pair (interpreter + torch):  {base:8,.0f} MiB")
    print(f"peak RSS, large pair:                      {peak:8,.0f} MiB  ({seconds:.0f} s)")
    print(
        f"  above baseline: {peak - base:,.0f} MiB = {(peak - base) / args.tensor_mb:.1f} x the largest tensor, "
        f"{(peak - base) / (2 * size):.3f} x the two models"
    )


if __name__ == "__main__":
    main()
