"""DeepSpeed checkpoint folders: two written by DeepSpeed itself, the rest built from its layout.

``test_save_dirs_written_by_deepspeed_*`` read ``data/deepspeed/``: two ZeRO-2 save dirs that
deepspeed 0.19.8 wrote on a CPU (2 gloo ranks; ``make_deepspeed_fixture.py`` says how, and why
``deepspeed`` is not a dependency). The other cases (ZeRO-3, model parallel, bf16, several tags,
an evil pickle) need shapes no small CPU run gives, so their folders follow the layout ``DeepSpeedEngine.save_checkpoint``
writes and ``deepspeed/utils/zero_to_fp32.py`` reads: ``latest`` naming the tag,
``global_stepN/mp_rank_00_model_states.pt`` holding ``module`` (the model's state dict) beside
``buffer_names``, ``param_shapes``, ``ds_config``, ``ds_version``, and per-rank
``zero_pp_rank_R_mp_rank_00_optim_states.pt`` holding the flattened fp32 partitions.
"""

from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from divergence.checkpoints import open_checkpoint
from divergence.checkpoints.compare import compare_checkpoints
from divergence.cli import main
from divergence.store import MetricsStore

from .forge import RunsCode


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.Linear(5, 2)).to(torch.bfloat16)


def _save_deepspeed(model, save_dir, step: int, stage: int = 2, world: int = 2) -> None:
    """What engine.save_checkpoint(save_dir) leaves for ``global_step{step}`` (ZeRO ``stage``)."""
    tag = save_dir / f"global_step{step}"
    tag.mkdir(parents=True)
    params = dict(model.named_parameters())
    module = {
        name: (torch.empty(0, dtype=t.dtype) if stage == 3 and name in params else t)
        for name, t in model.state_dict().items()
    }
    states = {
        "module": module,
        "buffer_names": [n for n, _ in model.named_buffers()],
        "optimizer": None,
        "param_shapes": [OrderedDict((n, p.shape) for n, p in params.items())],
        "frozen_param_shapes": None,
        "shared_params": {},
        "frozen_param_fragments": None,
        "lr_scheduler": None,
        "sparse_tensor_module_names": set(),
        "skipped_steps": 0,
        "global_steps": step,
        "global_samples": 8 * step,
        "dp_world_size": world,
        "mp_world_size": 1,
        "ds_config": {"train_batch_size": 8, "bf16": {"enabled": True}, "zero_optimization": {"stage": stage}},
        "ds_version": "0.16.4",
    }
    name = "mp_rank_00_model_states.pt" if stage < 3 else "zero_pp_rank_0_mp_rank_00_model_states.pt"
    torch.save(states, tag / name)
    flat = torch.cat([p.detach().float().reshape(-1) for p in params.values()])
    part = -(-flat.numel() // world)
    for rank in range(world):
        optim = {
            "zero_stage": stage,
            "partition_count": world,
            "single_partition_of_fp32_groups": [flat[rank * part : (rank + 1) * part].clone()],
        }
        torch.save(
            {"optimizer_state_dict": optim, "ds_version": "0.16.4"},
            tag / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt",
        )
    (save_dir / "latest").write_text(f"global_step{step}")


@pytest.fixture
def runs(tmp_path):
    for arm, seed in (("a", 0), ("b", 1)):
        model = _model(0)
        g = torch.Generator().manual_seed(seed)
        for step in (2, 4):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01 * torch.randn(p.shape, generator=g).to(p.dtype))
            _save_deepspeed(model, tmp_path / arm, step)
            (tmp_path / f"{arm}_st").mkdir(exist_ok=True)
            save_file(model.state_dict(), tmp_path / f"{arm}_st" / f"step_{step}.safetensors")
    return tmp_path


def test_deepspeed_folder_compares_as_the_same_weights_in_safetensors(runs):
    source = open_checkpoint(runs / "a")  # the save_dir: its 'latest' tag, global_step4
    assert source.info("0.weight").torch_dtype == torch.bfloat16 and len(source.names) == 9
    got = compare_checkpoints(runs / "a" / "global_step2", runs / "b" / "global_step2")
    want = compare_checkpoints(runs / "a_st" / "step_2.safetensors", runs / "b_st" / "step_2.safetensors")
    assert {r["name"]: r for r in got.records} == {r["name"]: r for r in want.records}
    assert want.summary["max_abs_diff"] > 0
    latest = compare_checkpoints(runs / "a", runs / "b")
    assert (
        latest.summary["wasserstein"]
        == compare_checkpoints(runs / "a" / "global_step4", runs / "b" / "global_step4").summary["wasserstein"]
    )


WRITTEN = Path(__file__).resolve().parent / "data" / "deepspeed"


def test_save_dirs_written_by_deepspeed_compare_exactly_as_their_weights_in_safetensors():
    """The real library's files: ``latest`` -> ``global_step3`` -> ``module`` of the model states,
    loaded weights-only, the optimizer shards never opened; every metric of every tensor equals the
    comparison of the same module's weights saved as safetensors by the writing process."""
    assert (WRITTEN / "a" / "latest").read_text().strip() == "global_step3"
    got = compare_checkpoints(WRITTEN / "a", WRITTEN / "b")
    want = compare_checkpoints(WRITTEN / "a.safetensors", WRITTEN / "b.safetensors")
    assert {r["name"]: r for r in got.records} == {r["name"]: r for r in want.records}
    assert len(got.records) == 4 and want.summary["max_abs_diff"] > 0
    assert set(open_checkpoint(WRITTEN / "a" / "global_step3").names) == set(
        open_checkpoint(WRITTEN / "a.safetensors").names
    )


def test_track_over_deepspeed_save_dirs(runs, tmp_path):
    assert main(["track", str(runs / "a"), str(runs / "b"), "--out", str(tmp_path / "ds"), "--quiet"]) == 0
    assert main(["track", str(runs / "a_st"), str(runs / "b_st"), "--out", str(tmp_path / "st"), "--quiet"]) == 0
    ds, oracle = MetricsStore(tmp_path / "ds"), MetricsStore(tmp_path / "st")
    assert ds.steps() == [2, 4]

    def rows(store):
        return sorted(store.tensor_records(), key=lambda r: (r["step"], r["tensor"]))

    assert rows(ds) == rows(oracle)


def _one_line(path, capsys, needle):
    assert main(["compare", str(path), str(path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_zero3_and_model_parallel_are_refused_with_the_way_out(tmp_path, capsys):
    _save_deepspeed(_model(0), tmp_path / "z3", 1, stage=3)
    _one_line(tmp_path / "z3", capsys, "ZeRO stage 3 checkpoint")
    _save_deepspeed(_model(0), tmp_path / "mp", 1)
    (tmp_path / "mp" / "global_step1" / "mp_rank_01_model_states.pt").write_bytes(b"")
    _one_line(tmp_path / "mp", capsys, "model-parallel DeepSpeed checkpoint (2 model-parallel ranks")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "latest").write_text("../mp/global_step1")
    assert main(["compare", str(tmp_path / "bad"), str(tmp_path / "bad"), "--format", "deepspeed", "--quiet"]) == 2
    assert "not a checkpoint tag" in capsys.readouterr().err
    _one_line(tmp_path / "bad", capsys, "no weights found")  # not recognised as DeepSpeed: the usual reader


def test_model_states_whose_unpickling_runs_code_is_refused(tmp_path, capsys):
    _save_deepspeed(_model(0), tmp_path / "ds", 1)
    marker = tmp_path / "pwned"
    states = tmp_path / "ds" / "global_step1" / "mp_rank_00_model_states.pt"
    torch.save({"module": _model(0).state_dict(), "lr_scheduler": RunsCode(marker)}, states)
    _one_line(tmp_path / "ds", capsys, "refused to unpickle: it references posix.mkdir")
    assert not marker.exists()
