"""``make gpu-check`` on a CPU machine: the no-GPU path, the part list and its commands, a part
that fails or hangs (recorded, the others go on), and the report/JSON assembled from results."""

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402
import gpu_check_summaries as summaries  # noqa: E402

from divergence.microbench.sweep import COLUMNS  # noqa: E402
from divergence.store import MetricsStore  # noqa: E402

NO_GPU = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))


def test_no_gpu_prints_one_line_and_exits_0(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path / "g")],
        env=NO_GPU,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.count("\n") == 1 and done.stdout.startswith("gpu-check: no CUDA GPU")
    assert not (tmp_path / "g").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_target_without_gpu():
    done = subprocess.run(
        ["make", "-s", "gpu-check", f"GPU_CHECK_PY={sys.executable}"],
        cwd=ROOT,
        env=NO_GPU,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.startswith("gpu-check: no CUDA GPU") and done.stdout.count("\n") == 1


def test_parts_and_their_commands(tmp_path):
    parts = gpu_check.build_parts(tmp_path, "PY", ["sdpa-flash", "sdpa-cudnn"], gpus=4)
    by = {p.name: p for p in parts}
    assert list(by) == [
        "microbench",
        "wasserstein",
        "sd15",
        "control-deterministic",
        "control-nondeterministic",
        "study",
        "ddp-watch",
    ]
    bench = by["microbench"].commands[0]
    assert bench[:4] == ["PY", "-m", "divergence", "microbench"]
    assert bench[bench.index("--device") + 1] == "cuda"
    impls = bench[bench.index("--impl") + 1 : bench.index("--accumulate")]
    assert impls == ["baseline", "flash", "sdpa-flash", "sdpa-cudnn"]
    tiles = bench[bench.index("--block-size") + 1 : bench.index("--set")]
    assert tiles == ["128x128", "64x64"]
    assert "train.deterministic=true" in by["control-deterministic"].commands[0]
    assert "train.deterministic=false" in by["control-nondeterministic"].commands[0]
    assert "references.precision=pairs/fp16-vs-fp32.yaml" in by["study"].commands[0]
    ddp = by["ddp-watch"].commands
    assert [c[c.index("--arm") + 1] for c in ddp[:2]] == ["a", "b"]
    assert all("train.devices=4" in c and "train.strategy=ddp" in c for c in ddp[:2])
    assert ddp[2][3] == "watch" and ddp[2][4] == ddp[0][ddp[0].index("--out") + 1]
    assert by["wasserstein"].commands[0][1].endswith("benchmarks/gpu_check_workers.py")
    for group in gpu_check.SPLIT:  # each group fits one 10-minute call, with room to start
        assert sum(by[name].timeout_s for name in group) <= 570
    assert sorted(n for g in gpu_check.SPLIT for n in g) == sorted(by)


def _fake_part(name, code, timeout=60):
    return gpu_check.Part(name, f"fake {name}", timeout, [[sys.executable, "-c", code]])


def test_a_failing_or_hanging_part_is_recorded(tmp_path):
    fail = gpu_check.run_part(
        _fake_part("sd15", "import sys; print('step 1'); sys.exit('RuntimeError: no kernel for fp32')"), tmp_path
    )
    assert fail["status"] == "failed" and "RuntimeError: no kernel for fp32" in fail["error"]
    hang = gpu_check.run_part(_fake_part("study", "import time; time.sleep(60)", timeout=2), tmp_path)
    assert hang["status"] == "timeout" and hang["seconds"] < 30
    empty = gpu_check.run_part(_fake_part("wasserstein", "print('ok')"), tmp_path)
    assert empty["status"] == "failed" and "reading its output" in empty["error"]  # exit 0 but no result.json
    (tmp_path / "parts" / "wasserstein" / "result.json").write_text(json.dumps(WASSERSTEIN))
    ok = gpu_check.run_part(_fake_part("wasserstein", "print('ok')"), tmp_path)
    assert ok["status"] == "ok" and ok["results"]["gpu"][1]["n"] == 10**9


WASSERSTEIN = {
    "cpu": {"n": 10**7, "seconds": 2.0, "value": 1e-3, "threads": 16},
    "gpu": [
        {
            "n": 10**8,
            "cpu_extrapolated_s": 20.0,
            "seconds": 0.1,
            "peak_gib": 2.5,
            "inputs_gib": 0.8,
            "speedup_vs_cpu": 200.0,
            "value": 1e-3,
        },
        {"n": 10**9, "cpu_extrapolated_s": 200.0, "error": "CUDA out of memory. Tried to allocate"},
    ],
}
SD15 = {
    "params": 859_520_964,
    "batch": 4,
    "resolution": 512,
    "steps": 6,
    "precision": "bf16-mixed",
    "one_arm": {"step_s": 0.25, "peak_gib": 30.0},
    "pair": {"step_s": 0.5, "peak_gib": 55.0},
    "compare_s": 0.4,
    "compare_peak_gib": 60.0,
    "pair_over_two_arms": 1.0,
    "tracking_overhead_every_10": 1.08,
    "tracking_overhead_every_1": 1.8,
}


def test_report_and_json_from_fake_results(tmp_path):
    rec = lambda name, status, results, error="": {  # noqa: E731
        "name": name,
        "title": f"t {name}",
        "status": status,
        "seconds": 12.0,
        "error": error,
        "commands": [],
        "results": results,
    }
    earlier = {
        "parts": [
            rec("study", "ok", {"verdicts": [{"status": "bounded", "headline": "flash is bounded"}]}),
            rec("sd15", "failed", {}, "old error"),
        ]
    }
    now = [
        rec("sd15", "ok", SD15),
        rec("wasserstein", "ok", WASSERSTEIN),
        rec("control-deterministic", "failed", {}, "exit 2: unknown key 'train.deterministic' | fix"),
    ]
    machine = {
        "gpu": "NVIDIA H100",
        "gpus": 1,
        "torch": "2.x",
        "cuda": "12.x",
        "kernels_unavailable": ["flash-attn: the flash-attn package is not installed"],
    }
    results = gpu_check.merge(earlier, now, machine)
    assert [p["name"] for p in results["parts"]] == ["wasserstein", "sd15", "control-deterministic", "study"]
    assert results["parts"][1]["status"] == "ok"  # this run's result replaces the earlier one
    json.loads(json.dumps(results))
    md = gpu_check.report_markdown(results)
    assert "NVIDIA H100 x1" in md and "- kernel left out: flash-attn: the flash-attn package is not installed" in md
    assert "| sd15 | ok | 12 | arm 0.25 s/step (30 GiB); pair 0.50 s/step (55 GiB); tracking x1.080 (every 10)" in md
    assert "unknown key 'train.deterministic' \\| fix" in md  # a pipe cannot break the table
    assert "| 1e8 | 0.100 | 2.50 | 0.80 | 20.0 | 200x |" in md and "CUDA out of memory" in md
    assert "bounded: flash is bounded" in md


def test_store_floor_reads_committed_steps(tmp_path):
    store = MetricsStore(tmp_path / "pair").open_for_append()
    for step in (1, 2, 3):
        tracked = step != 2
        record = {"tracked": tracked, "loss_a": 1.0, "loss_b": 1.0, "loss_diff": 0.0}
        if tracked:
            record.update(max_abs_diff=0.0, rel_l2=0.0)
        store.append_step(step, [], record)
    zero = summaries.store_floor(tmp_path / "pair")
    assert zero["exactly_zero"] and zero["tracked_steps"] == 2 and zero["last_step"] == 3
    store.append_step(4, [], {"tracked": True, "max_abs_diff": 3e-7, "rel_l2": 1e-8, "loss_diff": 1e-6})
    floor = summaries.store_floor(tmp_path / "pair")
    assert not floor["exactly_zero"] and floor["max_abs_diff"] == 3e-7
    assert summaries.headline("control-nondeterministic", floor).startswith("max |a-b| 3e-07")
    with pytest.raises(FileNotFoundError):
        summaries.store_floor(tmp_path / "nothing")


def test_microbench_summary_pairs_each_row_with_its_baseline(tmp_path):
    path = tmp_path / "run" / "results.csv"
    path.parent.mkdir()
    rows = [
        dict(impl="baseline", precision="bf16", accumulate="none", block_q="", block_kv="", block_order=""),
        dict(impl="sdpa-flash", precision="bf16", accumulate="kernel", block_q="", block_kv="", block_order=""),
        dict(impl="flash", precision="bf16", accumulate="fp32", block_q="128", block_kv="128", block_order="default"),
        dict(
            impl="flash",
            precision="bf16",
            accumulate="fp32",
            block_q="128",
            block_kv="128",
            block_order="default",
            input_dist="normal:2",
        ),
    ]  # scale study: not at the reference inputs
    errs = [(4e-3, 2e-4), (2e-3, 1e-4), (1e-3, 5e-5), (9.0, 9.0)]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, restval="")
        w.writeheader()
        for r, (mx, mean) in zip(rows, errs):
            w.writerow({"seq_len": 4096, "input_dist": "normal:1", **r, "max_abs_err": mx, "mean_abs_err": mean})
    out = summaries.summarize("microbench", tmp_path)
    assert [(x["impl"], x["ratio_max"], x["ratio_mean"]) for x in out["rows"]] == [
        ("baseline", 1.0, 1.0),
        ("sdpa-flash", 0.5, 0.5),
        ("flash", 0.25, 0.25),
    ]
    assert "| bf16 | re-impl 128x128 fp32-acc | 0.001 | 5e-05 | 0.25x | 0.25x |" in summaries.details("microbench", out)
