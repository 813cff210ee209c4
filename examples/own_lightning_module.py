"""Your own LightningModule, two arms in lockstep: SDPA's flash kernel vs diffusers' baseline attention.

A small diffusers UNet with self-attention learns to denoise small synthetic images of squares
(the example's own data; DDPM noise and timesteps drawn from the global RNG). ``LockstepPair`` trains two copies from
the same initial weights on the same batches, forks the RNG so both draw the same noise, and
writes the pair folder: ``pair.json`` and the metrics store ``metrics.jsonl``.

    python examples/own_lightning_module.py --out runs/flash-vs-baseline --steps 50
    divergence report runs/flash-vs-baseline --out report

Only ``LockstepPair`` comes from divergence; the module is plain Lightning + diffusers.
"""

import argparse

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, UNet2DModel
from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.data import DataLoader, Dataset

from divergence.lightning import LockstepPair


class Squares(Dataset):
    """The example's own images: a coloured square on a dark background, its place, size and colour
    drawn from seed 0, as (3, 16, 16) tensors in [-1, 1]."""

    def __init__(self, n: int = 256, size: int = 16):
        draw = torch.Generator().manual_seed(0)
        self.images = torch.full((n, 3, size, size), -0.8)
        for image in self.images:
            side = int(torch.randint(3, size // 2, (1,), generator=draw))
            top, left = torch.randint(0, size - side, (2,), generator=draw).tolist()
            image[:, top : top + side, left : left + side] = torch.rand(3, 1, 1, generator=draw) * 2 - 1

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i]


class Denoiser(pl.LightningModule):
    """An unconditional DDPM on 16x16 images; ``attention`` picks the attention kernel."""

    def __init__(self, attention: str, lr: float = 1e-3):
        super().__init__()
        self.attention, self.lr = attention, lr
        self.unet = UNet2DModel(
            sample_size=16,
            in_channels=3,
            out_channels=3,
            layers_per_block=1,
            block_out_channels=(16, 32),
            norm_num_groups=8,
            attention_head_dim=8,
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        )
        # per model, not process-wide: the baseline is diffusers' plain attention processor
        for block in self.unet.modules():
            if isinstance(block, Attention):
                block.set_processor(AttnProcessor2_0() if attention == "flash" else AttnProcessor())
        self.scheduler = DDPMScheduler(num_train_timesteps=1000)

    def training_step(self, images, batch_idx):
        noise = torch.randn_like(images)
        t = torch.randint(0, 1000, (images.shape[0],), device=images.device)
        noisy = self.scheduler.add_noise(images, noise, t)
        if self.attention == "flash":
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # forced: an unavailable kernel errors
                prediction = self.unet(noisy, t).sample
        else:
            prediction = self.unet(noisy, t).sample
        return F.mse_loss(prediction, noise)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/flash-vs-baseline")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--every", type=int, default=5)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    flash = Denoiser("flash")
    baseline = Denoiser("baseline")
    baseline.load_state_dict(flash.state_dict())  # the same initial weights
    pair = LockstepPair(
        flash,
        baseline,
        out=args.out,
        every=args.every,
        module="unet",
        name="flash-vs-baseline",
        arms={"a": ["attention=sdpa-flash"], "b": ["attention=baseline"]},
    )
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(pair, DataLoader(Squares(), batch_size=8, shuffle=False))
    print(f"{args.out}: {args.steps} steps; next: divergence report {args.out} --out report")


if __name__ == "__main__":
    main()
