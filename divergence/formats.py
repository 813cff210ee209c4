"""Checkpoint format names for ``--format`` (``compare``, ``track``), importable without torch.

The command line lists them in ``--help`` before anything heavy is imported; the readers
behind each name are in ``divergence.checkpoints.READERS``.
"""

AUTO = "auto"

# A DCP step folder that a writer of a pair folder made (divergence.pairfolder.arm.weights_dcp) is complete once
# it holds this marker, written last, after every rank has saved its shards; readers skip one without it.
DCP_COMPLETE_FILE = "complete.json"

# name -> what it reads
FORMATS = {
    "safetensors": "a .safetensors file",
    "pickle": "a torch .pt/.pth/.bin state dict or Lightning .ckpt (weights-only)",
    "pretrained": "a save_pretrained folder or diffusers pipeline",
    "lora": "a peft LoRA adapter folder",
    "dcp": "a torch.distributed.checkpoint folder (.metadata + *.distcp)",
    "megatron": "a Megatron-Core torch_dist folder (DCP + metadata.json): stacked layers split per layer",
    "deepspeed": "a DeepSpeed checkpoint folder (save_dir with 'latest', or global_stepN/; ZeRO 0-2)",
}


def format_help() -> str:
    return f"read both checkpoints as this format (default {AUTO}: recognised from the path): " + "; ".join(
        f"{name}: {what}" for name, what in FORMATS.items()
    )
