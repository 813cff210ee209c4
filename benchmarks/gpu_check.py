"""``make gpu-check``: run every GPU-only part of divergence once and write what it measured.

    PYTHONPATH=. python3 benchmarks/gpu_check.py [--out gpu-check] [--parts NAME ...] [--list]

Parts (each a subprocess with its own time limit; a failure is recorded with its last error
line and the others still run):

- ``microbench``: every CUDA attention kernel available here (SDPA flash, efficient, cuDNN,
  math; flash-attn when installed) against the re-implementation at the kernels' real tiles;
- ``wasserstein``: W1 at 1e8 and 1e9 elements on the GPU (time, peak memory) against the CPU
  path (measured at 1e7, extrapolated per element);
- ``sd15``: the SD-1.5-sized recipe with random weights and synthetic latents: step time and
  peak memory of one arm and of a lockstep pair, tracking overhead at every 10 and every 1;
- ``control-deterministic`` / ``control-nondeterministic``: the control pair, 50 steps, with
  ``train.deterministic`` true (must be exactly zero) and false (the hardware's floor);
- ``study``: the default study on the tiny model with the paper's fp16-vs-fp32 reference;
- ``ddp-watch``: both arms of the control pair as separate DDP jobs on every GPU here, then
  ``divergence watch``.

Writes ``OUT/report.md`` and ``OUT/results.json``; parts not run this time keep their earlier
results (so the check can be split over two calls, ``--parts`` one group of ``SPLIT`` each). Without a CUDA GPU it prints one line and
exits 0. It needs no pip or make: run it with the project on PYTHONPATH and whatever torch the
machine has (``/work/shared/GPU.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import gpu_check_summaries as summaries

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = 1
# CUDA kernels the microbenchmark can force; the re-implementation ("flash") is always there.
CUDA_KERNELS = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math", "flash-attn")
# Real tiles at head dim 64 (forward, no dropout): FlashAttention-2 128x128
# (flash_fwd_launch_template.h, run_mha_fwd_hdim64); memory-efficient (CUTLASS) 64x64.
KERNEL_TILES = ("128x128", "64x64")
NO_WANDB = "log.wandb=false"
# Two calls of at most 10 minutes each on a lent GPU machine: each group's limits sum to <= 570 s.
# Expected on one H100 (not yet measured): about 8-9 minutes for both together.
SPLIT = (
    ("microbench", "wasserstein", "sd15", "control-deterministic", "control-nondeterministic"),
    ("study", "ddp-watch"),
)


@dataclass(frozen=True)
class Part:
    """One part of the check: commands run in order in ``folder``, then ``summarize(folder)``."""

    name: str
    title: str
    timeout_s: int
    commands: list[list[str]] = field(default_factory=list)


def build_parts(out: Path, python: str, kernels: list[str], gpus: int) -> list[Part]:
    """Every part, with the exact commands it runs (pure: no CUDA query, nothing run)."""
    dv = [python, "-m", "divergence"]
    work = lambda name: str(out / "parts" / name)  # noqa: E731
    control = str(ROOT / "recipes" / "pairs" / "control.yaml")
    workers = str(ROOT / "benchmarks" / "gpu_check_workers.py")
    return [
        Part(
            "microbench",
            "attention kernels vs the re-implementation (CUDA)",
            120,
            [
                dv
                + [
                    "microbench",
                    "--device",
                    "cuda",
                    "--no-progress",
                    "--out",
                    work("microbench") + "/run",
                    "--precision",
                    "bf16",
                    "fp16",
                    "--seq-len",
                    "1024",
                    "4096",
                    "16384",
                    "--impl",
                    "baseline",
                    "flash",
                    *kernels,
                    "--accumulate",
                    "none",
                    "fp32",
                    "--block-size",
                    *KERNEL_TILES,
                    "--set",
                    "sweep.reference_seq_len=4096",
                ]
            ],
        ),
        Part(
            "wasserstein",
            "Wasserstein-1 at 1e8 and 1e9 elements, GPU vs CPU",
            90,
            [
                [
                    python,
                    workers,
                    "wasserstein",
                    work("wasserstein") + "/result.json",
                    "--sizes",
                    "1e8",
                    "1e9",
                    "--cpu-size",
                    "1e7",
                ]
            ],
        ),
        Part(
            "sd15",
            "SD-1.5-sized recipe: step time, memory, tracking overhead",
            180,
            [[python, workers, "sd15", work("sd15") + "/result.json", "--batch", "4", "--steps", "6"]],
        ),
        Part(
            "control-deterministic",
            "control pair, 50 steps, train.deterministic=true (must be 0)",
            90,
            [
                dv
                + [
                    "train",
                    "--recipe",
                    control,
                    "--out",
                    work("control-deterministic") + "/pair",
                    "--max-steps",
                    "50",
                    "train.deterministic=true",
                    NO_WANDB,
                ]
            ],
        ),
        Part(
            "control-nondeterministic",
            "control pair, 50 steps, train.deterministic=false (floor)",
            90,
            [
                dv
                + [
                    "train",
                    "--recipe",
                    control,
                    "--out",
                    work("control-nondeterministic") + "/pair",
                    "--max-steps",
                    "50",
                    "train.deterministic=false",
                    NO_WANDB,
                ]
            ],
        ),
        Part(
            "study",
            "default study, tiny model, fp16-vs-fp32 reference",
            400,
            [
                dv
                + [
                    "study",
                    "--out",
                    work("study") + "/study",
                    "--no-wandb",
                    "--quiet",
                    "references.precision=pairs/fp16-vs-fp32.yaml",
                    NO_WANDB,
                ]
            ],
        ),
        Part(
            "ddp-watch",
            f"separate-arm DDP jobs on {gpus} GPU(s), then watch",
            150,
            [
                dv
                + [
                    "train",
                    "--recipe",
                    control,
                    "--arm",
                    arm,
                    "--out",
                    work("ddp-watch") + "/pair",
                    "--max-steps",
                    "30",
                    f"train.devices={gpus}",
                    "train.strategy=ddp",
                    NO_WANDB,
                ]
                for arm in ("a", "b")
            ]
            + [dv + ["watch", work("ddp-watch") + "/pair", "--timeout", "60", "--no-wandb", "--quiet"]],
        ),
    ]


def run_part(part: Part, out: Path, env: dict | None = None) -> dict:
    """Run ``part``'s commands under one time limit; never raises for the part's failure."""
    folder = out / "parts" / part.name
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "log.txt"
    record = {
        "name": part.name,
        "title": part.title,
        "status": "ok",
        "seconds": 0.0,
        "error": "",
        "commands": [" ".join(c) for c in part.commands],
        "results": {},
    }
    start = time.perf_counter()
    with open(log, "w") as sink:
        for command in part.commands:
            left = part.timeout_s - (time.perf_counter() - start)
            code = _run(command, sink, left, env)
            if code is None:
                record.update(status="timeout", error=f"stopped after the part's {part.timeout_s} s limit")
                break
            if code != 0:
                record.update(status="failed", error=f"exit {code}: {last_error_line(log)}")
                break
    record["seconds"] = round(time.perf_counter() - start, 1)
    try:
        record["results"] = summaries.summarize(part.name, folder)
    except Exception as err:  # a part that died early leaves nothing to read: say why, go on
        if record["status"] == "ok":
            record.update(status="failed", error=f"reading its output: {type(err).__name__}: {err}")
    return record


def _run(command: list[str], sink, timeout_s: float, env: dict | None) -> int | None:
    """Exit code, or None when the limit ran out (the whole process group is then killed)."""
    sink.write(f"$ {' '.join(command)}\n")
    sink.flush()
    if timeout_s <= 0:
        return None
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )  # its own group: DDP children die with it
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def last_error_line(log: Path) -> str:
    """The last line that reads like an error, else the last non-empty line."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("$ ")]
    for line in reversed(lines):
        if "error" in line.lower() or "exception" in line.lower():
            return line[:300]
    return lines[-1][:300] if lines else "(no output)"


def project_env() -> dict:
    """This process's environment with the project first on PYTHONPATH (no install needed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("WANDB_MODE", "offline")
    return env


def merge(previous: dict | None, records: list[dict], machine: dict) -> dict:
    """results.json: this run's parts, plus earlier parts not run this time, in part order."""
    kept = {p["name"]: p for p in (previous or {}).get("parts", [])}
    kept.update({r["name"]: r for r in records})
    order = [p.name for p in build_parts(Path("."), "python3", [], 1)]
    parts = sorted(kept.values(), key=lambda p: order.index(p["name"]) if p["name"] in order else len(order))
    return {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine,
        "parts": parts,
    }


def report_markdown(results: dict) -> str:
    """``report.md``: a status table, then each part's numbers."""
    m = results.get("machine", {})
    lines = [
        "# divergence gpu-check",
        "",
        f"{m.get('gpu', '?')} x{m.get('gpus', '?')}, torch {m.get('torch', '?')}, CUDA {m.get('cuda', '?')}; "
        f"written {results.get('created', '?')}. Numbers: `results.json`; logs: `parts/<name>/log.txt`.",
        "",
    ]
    lines += [f"- kernel left out: {line}" for line in m.get("kernels_unavailable", [])]
    lines += ["", "| part | status | seconds | result | error |", "|---|---|---|---|---|"]
    for p in results["parts"]:
        lines.append(
            f"| {p['name']} | {p['status']} | {p['seconds']:.0f} | "
            f"{_cell(summaries.headline(p['name'], p.get('results') or {}))} | {_cell(p['error'])} |"
        )
    for p in results["parts"]:
        lines += ["", f"## {p['name']}: {p['title']}", ""]
        lines += summaries.details(p["name"], p.get("results") or {}) or ["(no results)"]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def cuda_machine() -> dict | None:
    """The GPU's description, or None without CUDA (the only CUDA query, at run time)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return {
        "gpu": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def available_kernels() -> tuple[list[str], list[str]]:
    """CUDA kernels that run here in bf16 and fp16 at head dim 64, and why the others do not."""
    import torch

    from divergence.attention.kernels import get_kernel

    ok, missing = [], []
    for name in CUDA_KERNELS:
        reasons = [get_kernel(name).unavailable_reason("cuda", dt, 64) for dt in (torch.bfloat16, torch.float16)]
        reason = next((r for r in reasons if r), None)
        (missing.append(f"{name}: {reason}") if reason else ok.append(name))
    return ok, missing


def main(argv=None) -> int:
    names = [p.name for p in build_parts(Path("."), "python3", [], 1)]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu-check", help="output folder (default gpu-check)")
    ap.add_argument("--parts", nargs="+", choices=names, help="run only these parts (default: all)")
    ap.add_argument("--list", action="store_true", help="print the parts and their time limits, run nothing")
    args = ap.parse_args(argv)
    if args.list:
        for p in build_parts(Path(args.out), sys.executable, list(CUDA_KERNELS), 1):
            print(f"{p.name:<26} {p.timeout_s:>4} s  {p.title}")
        return 0
    machine = cuda_machine()
    if machine is None:
        print(
            "gpu-check: no CUDA GPU on this machine (torch missing or torch.cuda.is_available() is False); "
            "nothing checked"
        )
        return 0
    sys.path.insert(0, str(ROOT))
    kernels, missing = available_kernels()
    machine["kernels"], machine["kernels_unavailable"] = kernels, missing
    out = Path(args.out).resolve()
    parts = [p for p in build_parts(out, sys.executable, kernels, machine["gpus"]) if p.name in (args.parts or names)]
    env, records = project_env(), []
    for i, part in enumerate(parts, 1):
        print(f"[{i}/{len(parts)}] {part.name} (limit {part.timeout_s} s) ...", flush=True)
        records.append(run_part(part, out, env))
        r = records[-1]
        print(f"[{i}/{len(parts)}] {part.name}: {r['status']} in {r['seconds']:.0f} s {r['error']}", flush=True)
    path = out / "results.json"
    results = merge(json.loads(path.read_text()) if path.exists() else None, records, machine)
    path.write_text(json.dumps(results, indent=2, default=str))
    (out / "report.md").write_text(report_markdown(results))
    print(f"wrote {out / 'report.md'} and {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
