"""An accelerate + diffusers text-to-image training loop, with the lines ``divergence`` adds marked ``# divergence:``.

The loop has the shape of diffusers' ``examples/text_to_image/train_text_to_image.py``:
gradient accumulation under ``accelerator.accumulate``, the optimizer step counted as
``global_step`` under ``accelerator.sync_gradients``, the loss averaged over micro-batches and
ranks (``accelerator.gather``), ``checkpoint-N/`` folders written by ``accelerator.save_state``
(the UNet in ``checkpoint-N/unet`` through a save hook) and ``--resume_from_checkpoint latest``.
It runs on a CPU with a tiny random-weight pipeline it builds itself (nothing downloaded): a
``UNet2DConditionModel`` and a ``CLIPTextModel`` from tiny configs, a ``DDPMScheduler``, and
pre-encoded latents in place of a VAE (diffusers' script encodes images with the VAE first).

Two arms, each its own job, into one pair folder; ``divergence watch`` follows them::

    python examples/diffusers_text_to_image.py --output_dir runs/seed0 --seed 0 --divergence_dir runs/pair --divergence_arm a
    python examples/diffusers_text_to_image.py --output_dir runs/seed1 --seed 1 --divergence_dir runs/pair --divergence_arm b
    divergence watch runs/pair
    divergence report runs/pair --out report

The same ``checkpoint-N/`` folders also make a pair afterwards, without the added lines:
``divergence track runs/seed0 runs/seed1 --component unet --out runs/pair-from-checkpoints``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from diffusers import DDPMScheduler, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel

import divergence  # divergence:

CAPTIONS = ["a red square", "a blue circle", "a green triangle", "a yellow star"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output_dir", required=True)
    p.add_argument("--seed", type=int, default=0, help="noise and timesteps (the weights are the pipeline's)")
    p.add_argument("--train_batch_size", type=int, default=2)
    p.add_argument("--gradient_accumulation_steps", type=int, default=2)
    p.add_argument("--max_train_steps", type=int, default=6)
    p.add_argument("--learning_rate", type=float, default=1e-3)
    p.add_argument("--checkpointing_steps", type=int, default=2)
    p.add_argument("--resume_from_checkpoint", default=None, help='a checkpoint-N folder or "latest"')
    p.add_argument("--mixed_precision", default="no", choices=("no", "bf16", "fp16"))
    p.add_argument("--num_examples", type=int, default=8)
    p.add_argument("--stop_after_steps", type=int, default=None, help="stop there, as a preempted job would")
    p.add_argument("--divergence_dir", required=True, help="the pair folder (both arms the same)")
    p.add_argument("--divergence_arm", default="a", choices=("a", "b"))
    p.add_argument("--divergence_every", type=int, default=2)
    p.add_argument("--divergence_name", default="diffusers-text-to-image")
    p.add_argument("--divergence_category", default="seed")
    return p.parse_args(argv)


def tiny_pipeline():
    """The "pretrained" UNet and text encoder: random weights from a fixed seed (the same in both arms)."""
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=8,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
        )
    )
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(8, 16),
        norm_num_groups=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=2,
    )
    return text_encoder, unet, DDPMScheduler(num_train_timesteps=100)


def tiny_dataset(num_examples: int) -> list[dict]:
    """Pre-encoded latents (4 x 8 x 8) and token ids (a character code per token), fixed across arms."""
    g = torch.Generator().manual_seed(1234)
    rows = []
    for i in range(num_examples):
        caption = CAPTIONS[i % len(CAPTIONS)]
        ids = torch.tensor([ord(c) % 64 for c in caption[:8].ljust(8)])
        rows.append({"latents": torch.randn(4, 8, 8, generator=g), "input_ids": ids})
    return rows


def collate(rows):
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


def latest_checkpoint(output_dir: str) -> str | None:
    names = [d for d in os.listdir(output_dir) if d.startswith("checkpoint-")] if os.path.isdir(output_dir) else []
    return max(names, key=lambda d: int(d.split("-")[1]), default=None)


def main(argv=None) -> int:
    args = parse_args(argv)
    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps, mixed_precision=args.mixed_precision
    )
    text_encoder, unet, noise_scheduler = tiny_pipeline()
    set_seed(args.seed)
    text_encoder.requires_grad_(False)
    unet.train()

    def save_model_hook(models, weights, output_dir):  # as diffusers: the UNet in checkpoint-N/unet
        if accelerator.is_main_process:
            for model in models:
                model.save_pretrained(os.path.join(output_dir, "unet"))
                weights.pop()

    def load_model_hook(models, input_dir):
        for _ in range(len(models)):
            model = models.pop()
            loaded = UNet2DConditionModel.from_pretrained(input_dir, subfolder="unet")
            model.register_to_config(**loaded.config)
            model.load_state_dict(loaded.state_dict())
            del loaded

    accelerator.register_save_state_pre_hook(save_model_hook)
    accelerator.register_load_state_pre_hook(load_model_hook)

    optimizer = torch.optim.AdamW(unet.parameters(), lr=args.learning_rate)
    loader = torch.utils.data.DataLoader(
        tiny_dataset(args.num_examples), batch_size=args.train_batch_size, shuffle=False, collate_fn=collate
    )
    unet, optimizer, loader = accelerator.prepare(unet, optimizer, loader)
    steps_per_epoch = math.ceil(len(loader) / args.gradient_accumulation_steps)
    num_epochs = math.ceil(args.max_train_steps / steps_per_epoch)

    global_step, first_epoch = 0, 0
    if args.resume_from_checkpoint:
        path = args.resume_from_checkpoint
        path = latest_checkpoint(args.output_dir) if path == "latest" else os.path.basename(path)
        if path is None:
            accelerator.print("no checkpoint to resume from; starting a new run")
        else:
            accelerator.load_state(os.path.join(args.output_dir, path))
            global_step = int(path.split("-")[1])
            first_epoch = global_step // steps_per_epoch
    resume_batches = (global_step % steps_per_epoch) * args.gradient_accumulation_steps

    # divergence: one arm of the pair; start_step: a resume keeps every step before it
    writer = divergence.ArmWriter(
        args.divergence_dir,
        args.divergence_arm,
        max_steps=args.max_train_steps,
        every=args.divergence_every,
        start_step=global_step,
        name=args.divergence_name,
        category=args.divergence_category,
    )
    if global_step == 0:  # divergence: the initial weights
        writer.record(0, accelerator.unwrap_model(unet))  # divergence:

    train_loss = 0.0
    for epoch in range(first_epoch, num_epochs):
        batches = accelerator.skip_first_batches(loader, resume_batches) if epoch == first_epoch else loader
        for batch in batches:
            with accelerator.accumulate(unet):
                latents = batch["latents"]
                noise = torch.randn_like(latents)
                timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (latents.shape[0],))
                noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)
                encoder_hidden_states = text_encoder(batch["input_ids"], return_dict=False)[0]
                model_pred = unet(noisy_latents, timesteps, encoder_hidden_states, return_dict=False)[0]
                loss = F.mse_loss(model_pred.float(), noise.float(), reduction="mean")
                # the mean over the ranks' losses, accumulated over the micro-batches of one optimizer step
                avg_loss = accelerator.gather(loss.repeat(args.train_batch_size)).mean()
                train_loss += avg_loss.item() / args.gradient_accumulation_steps
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(unet.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()

            if accelerator.sync_gradients:  # one optimizer step done: global_step counts it
                global_step += 1
                writer.record(global_step, accelerator.unwrap_model(unet), train_loss)  # divergence: loss; weights
                train_loss = 0.0
                if global_step % args.checkpointing_steps == 0 and accelerator.is_main_process:
                    save_path = os.path.join(args.output_dir, f"checkpoint-{global_step}")
                    shutil.rmtree(save_path, ignore_errors=True)
                    accelerator.save_state(save_path)
                if global_step >= args.max_train_steps or global_step == args.stop_after_steps:
                    break
        if global_step >= args.max_train_steps or global_step == args.stop_after_steps:
            break

    accelerator.wait_for_everyone()
    if global_step != args.stop_after_steps:  # a preempted job ends without finishing
        writer.finish()  # divergence: the arm is finished
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
