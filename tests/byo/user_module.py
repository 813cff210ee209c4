"""A LightningModule divergence knows nothing about: a user's tiny denoiser with dropout.

Its ``training_step`` draws from the global RNG (noise, a noise level, dropout masks), the
way a diffusion model's does; ``gelu`` picks the activation so two arms can differ in one
deterministic thing.
"""

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Denoiser(pl.LightningModule):
    def __init__(self, width: int = 16, lr: float = 0.05, approximate: str = "none", dropout: float = 0.1):
        super().__init__()
        self.approximate = approximate
        self.net = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.Dropout(dropout), torch.nn.Linear(width, 8))
        self.norm = torch.nn.LayerNorm(8)
        self.lr = lr

    def forward(self, x):  # (B, 8) -> (B, 8)
        h = self.net[0](x)
        h = torch.nn.functional.gelu(h, approximate=self.approximate)
        return self.net[2](self.net[1](h)) + self.norm(x)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        noise = torch.randn_like(x)
        sigma = torch.rand(x.shape[0], 1)
        loss = torch.nn.functional.mse_loss(self(x + sigma * noise), noise)
        self.log("loss", loss)
        return {"loss": loss}

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr)
        schedule = torch.optim.lr_scheduler.StepLR(opt, 3)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def loader(n: int = 64, batch: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(7)
    return DataLoader(TensorDataset(torch.randn(n, 8, generator=g)), batch_size=batch, shuffle=False)


def build(seed: int = 0, **kwargs) -> Denoiser:
    torch.manual_seed(seed)
    return Denoiser(**kwargs)


def trainer(max_steps: int, callbacks=(), logger=False, **kwargs) -> pl.Trainer:
    return pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        deterministic=True,
        **kwargs,
    )
