"""``divergence compare A B | head``: a reader that leaves early ends the command quietly."""

import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from divergence.cli import EXIT_CLOSED_PIPE

ROOT = Path(__file__).resolve().parents[2]


def test_a_closed_pipe_ends_compare_without_a_traceback(tmp_path):
    g = torch.Generator().manual_seed(0)
    a = {f"blocks.{i}.linear.weight": torch.randn(8, 8, generator=g) for i in range(40)}
    save_file(a, tmp_path / "a.safetensors")
    save_file({k: v + 1e-3 for k, v in a.items()}, tmp_path / "b.safetensors")
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command prints a line: every write is EPIPE
    try:
        result = subprocess.run(
            [sys.executable, "-m", "divergence", "compare", "a.safetensors", "b.safetensors", "--top", "0"],
            cwd=tmp_path,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )
    finally:
        os.close(write)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr
    assert result.returncode == EXIT_CLOSED_PIPE == 141
