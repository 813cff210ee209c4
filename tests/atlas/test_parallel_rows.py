"""The atlas rows of issue 34 built here: where each trains, and the one line where it does not."""

from divergence.atlas.catalog import OPTIMIZATIONS, select
from divergence.variants import VARIANTS


def test_each_row_says_where_it_trains_and_why_not_elsewhere():
    tp, qat, offload = OPTIMIZATIONS["tensor-parallel"], OPTIMIZATIONS["int8-qat"], OPTIMIZATIONS["fsdp-offload"]
    assert tp.unavailable("cpu", "dit") is None and tp.unavailable("cpu", "unet").startswith("dit only")
    assert qat.unavailable("cpu", "unet") is None and qat.unavailable("cpu", "dit") is None
    assert offload.unavailable("cpu", "unet").startswith("GPU only") and offload.unavailable("cuda", "unet") is None
    assert "pip install --no-build-isolation deepspeed==0.19.8" in OPTIMIZATIONS["deepspeed-zero"].unavailable("cpu")
    assert "zero-1, fsdp-grad-op and fsdp-full" in OPTIMIZATIONS["deepspeed-zero"].needs
    assert "not built" in OPTIMIZATIONS["pipeline"].unavailable("cpu")
    assert "fsdp" not in [o.name for o in select(None)] and [o.name for o in select(["fsdp"])] == ["fsdp"]
    for name in ("fsdp-full", "fsdp-grad-op", "fsdp"):  # FSDP2 on gloo CPU ranks, both dense backbones
        assert (
            OPTIMIZATIONS[name].unavailable("cpu", "unet") is None
            and OPTIMIZATIONS[name].unavailable("cpu", "dit") is None
        )


def test_the_parallel_rows_are_fp32_reorderings_and_qat_is_not():
    assert VARIANTS["tensor-parallel"].fp32_equivalent and VARIANTS["fsdp-offload"].fp32_equivalent
    assert VARIANTS["fsdp"].fp32_equivalent and "GPU" not in VARIANTS["fsdp"].help.replace("GPUs", "")
    assert not VARIANTS["int8-qat"].fp32_equivalent
