"""``divergence compare`` on folders a training script leaves: a diffusers ``output_dir`` (the final
pipeline beside ``checkpoint-N/`` folders) and a DeepSpeed-style ``global_stepN/`` folder."""

import json

import torch

from divergence.cli import main
from tests.checkpoints.conftest import tiny_clip, tiny_unet

MODEL_INDEX = {
    "_class_name": "StableDiffusionPipeline",
    "_diffusers_version": "0.42.1",
    "unet": ["diffusers", "UNet2DConditionModel"],
    "text_encoder": ["transformers", "CLIPTextModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "scheduler": ["diffusers", "DDPMScheduler"],
}


def output_dir(folder, seed: int):
    """What train_text_to_image.py leaves: the pipeline's components, model_index.json, and per
    checkpoint-N/ diffusers' save hook's unet/ beside accelerate's optimizer.bin and scheduler.bin."""
    unet, clip = tiny_unet(seed), tiny_clip(seed)
    unet.save_pretrained(folder / "unet")
    clip.save_pretrained(folder / "text_encoder")
    (folder / "tokenizer").mkdir()
    (folder / "scheduler").mkdir()
    (folder / "scheduler" / "scheduler_config.json").write_text("{}")
    (folder / "model_index.json").write_text(json.dumps(MODEL_INDEX))
    optimizer = torch.optim.AdamW(unet.parameters())
    for step in (2, 4):
        checkpoint = folder / f"checkpoint-{step}"
        unet.save_pretrained(checkpoint / "unet")
        torch.save(optimizer.state_dict(), checkpoint / "optimizer.bin")
        torch.save({"last_epoch": step}, checkpoint / "scheduler.bin")
    return unet, clip


def test_a_diffusers_output_dir_compares_the_final_pipeline_and_names_what_it_skipped(tmp_path, capsys):
    unet, clip = output_dir(tmp_path / "out-a", 0)
    output_dir(tmp_path / "out-b", 1)
    code = main(["compare", str(tmp_path / "out-a"), str(tmp_path / "out-b"), "--json", str(tmp_path / "c.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads((tmp_path / "c.json").read_text())["summary"]
    floats = [t for t in (*unet.state_dict().values(), *clip.state_dict().values()) if t.is_floating_point()]
    assert summary["numel"] == sum(t.numel() for t in floats)  # the final unet and text encoder, nothing else
    assert "skipped checkpoint-2/, checkpoint-4/ (not in its model_index.json)" in out
    assert f"divergence track {tmp_path / 'out-a'} OTHER_OUTPUT_DIR --component unet --out PAIR" in out


def test_a_deepspeed_folder_is_read_through_its_model_states_file(tmp_path, capsys):
    """The DeepSpeed reader (checkpoints.zero_folder) reads such a folder: ``global_stepN/`` and the
    save_dir around it (its ``latest`` tag) compare as ``mp_rank_00_model_states.pt`` itself does."""
    for side, seed in (("a", 0), ("b", 1)):
        folder = tmp_path / side / "global_step2"
        folder.mkdir(parents=True)
        state = {k: v for k, v in tiny_unet(seed).state_dict().items()}
        torch.save({"module": state, "ds_version": "0.14.0", "global_steps": 2}, folder / "mp_rank_00_model_states.pt")
        torch.save({"optimizer_state_dict": {}}, folder / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")
        (tmp_path / side / "latest").write_text("global_step2")
    a, b = tmp_path / "a" / "global_step2", tmp_path / "b" / "global_step2"
    json_of = {}
    for name, (x, y) in {
        "file": (a / "mp_rank_00_model_states.pt", b / "mp_rank_00_model_states.pt"),
        "tag": (a, b),
        "save_dir": (tmp_path / "a", tmp_path / "b"),
    }.items():
        assert main(["compare", str(x), str(y), "--quiet", "--json", str(tmp_path / f"{name}.json")]) == 0
        json_of[name] = json.loads((tmp_path / f"{name}.json").read_text())["tensors"]
    assert json_of["tag"] == json_of["file"] == json_of["save_dir"] and json_of["file"]
