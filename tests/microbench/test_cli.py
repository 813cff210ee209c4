"""``divergence microbench`` end to end in quick mode, and every bad-input path: exit 2, one line."""

import base64
import csv

import pytest

from divergence.cli import main

CONTRACT = [
    "impl",
    "precision",
    "accumulate",
    "seq_len",
    "head_dim",
    "block_q",
    "block_kv",
    "block_order",
    "max_abs_err",
    "mean_abs_err",
    "std_abs_err",
    "max_abs_diff_vs_baseline",
]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("microbench")
    assert main(["microbench", "--quick", "--no-progress", "--out", str(out)]) == 0
    return out


def test_writes_the_csv_contract(quick_run):
    with open(quick_run / "results.csv") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames[: len(CONTRACT)] == CONTRACT
    assert {r["impl"] for r in rows} == {"baseline", "flash", "flash-unbiased", "sdpa-flash", "sdpa-math"}
    assert {r["precision"] for r in rows} == {"bf16", "fp16", "fp32", "fp64"}
    assert {r["accumulate"] for r in rows if r["impl"] == "flash"} == {"none", "fp32"}
    baseline = [r for r in rows if r["impl"] == "baseline"]
    assert all(float(r["max_abs_diff_vs_baseline"]) == 0 for r in baseline)
    bf16 = next(r for r in baseline if r["precision"] == "bf16")
    assert float(bf16["max_abs_err"]) > float(bf16["mean_abs_err"]) > 0


def test_writes_figures_and_reports(quick_run):
    for name in ("fig3_formats", "fig4_golden", "fig5_seq_len", "fig6_tiles", "fig7_input_scale", "fig8_bias"):
        assert (quick_run / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (quick_run / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 6  # self-contained
    start = page.index("data:image/png;base64,") + len("data:image/png;base64,")
    assert base64.b64decode(page[start : page.index("'", start)])[:4] == b"\x89PNG"
    summary = (quick_run / "summary.md").read_text()
    assert "At bf16, seq 128, flash deviates" in summary
    assert "Re-implementation vs PyTorch's CPU flash kernel" in summary
    assert (quick_run / "validation.csv").exists() and (quick_run / "recipe.yaml").exists()


def test_flags_narrow_the_sweep(tmp_path):
    code = main(
        [
            "microbench",
            "--quick",
            "--no-progress",
            "--precision",
            "bf16",
            "--seq-len",
            "64",
            "--block-size",
            "8x16",
            "16",
            "--impl",
            "baseline",
            "flash",
            "--accumulate",
            "fp32",
            "--input-dist",
            "normal:0.5",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["precision"] for r in rows} == {"bf16"} and {r["seq_len"] for r in rows} == {"64"}
    assert {(r["block_q"], r["block_kv"]) for r in rows if r["block_order"] == "default"} == {("8", "16"), ("16", "16")}
    assert {r["accumulate"] for r in rows if r["impl"] == "flash"} == {"fp32"}
    assert {r["input_dist"] for r in rows} == {"normal:1", "normal:0.5"}  # reference inputs, then the scale study
    assert {r["block_order"] for r in rows if r["input_dist"] == "normal:0.5"} == {"", "default"}


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--precision", "bf8"], "'bf8' is not one of bf16, fp16, fp32, fp64"),
        (["--block-size", "256"], "block size 256x256"),
        (["--block-size", "8y8"], "block size '8y8'"),
        (["--impl", "sdpa-efficient"], "--impl sdpa-efficient is unavailable on cpu"),
        (["--impl", "flash-attn"], "--impl flash-attn is unavailable"),
        (["--impl", "warp-attn"], "'warp-attn' is not one of"),
        (["--seq-len", "0"], "positive lengths"),
        (["--accumulate", "fp16"], "'fp16' is not one of"),
        (["--input-dist", "normal:0"], "inputs.scales: 'normal:0': the std must be in"),
        (["--set", "inputs.heads=two"], "inputs.heads: expected an integer"),
        (["--recipe", "/nonexistent/microbench.yaml"], "recipe file not found"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, needle, tmp_path, capsys):
    assert main(["microbench", "--quick", "--no-progress", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("divergence microbench: error:")
    assert needle in err
    assert not (tmp_path / "out").exists()  # nothing written before the check


def test_cuda_unavailable_exits_2(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert (
        main(
            [
                "microbench",
                "--quick",
                "--impl",
                "baseline",
                "flash",
                "sdpa-flash",
                "--device",
                "cuda",
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "CUDA is not available" in capsys.readouterr().err
