"""A Lightning user's language model that divergence did not write: a small causal transformer
with dropout, its own ``configure_optimizers`` (AdamW, two parameter groups, a warm-up schedule)
and its own ``training_step``; tracked as the issue's user tracked it:

- ``LockstepPair`` of two copies: exactly zero at every step (dropout masks drawn alike);
- ``ArmCheckpoints`` in two Trainers (one after the other in this process) + ``watch``, the
  arms differing in AdamW's implementation (foreach vs fused): the same store,
  record for record, as ``LockstepPair`` of the same two modules.
"""

import json

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from divergence.cli import main
from divergence.lightning import ArmCheckpoints, LockstepPair
from divergence.store import MetricsStore
from tests.byo.user_module import trainer

VOCAB, LENGTH, STEPS = 32, 12, 6


class TinyLM(pl.LightningModule):
    def __init__(self, kernel: str = "foreach", width: int = 16, dropout: float = 0.2):
        super().__init__()
        self.kernel = kernel  # AdamW's implementation: "foreach" or "fused"
        self.embed = torch.nn.Embedding(VOCAB, width)
        self.position = torch.nn.Parameter(torch.zeros(LENGTH, width))
        layer = torch.nn.TransformerEncoderLayer(width, 2, 2 * width, dropout=dropout, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, VOCAB)

    def forward(self, tokens):  # (B, T) -> (B, T, VOCAB)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        return self.head(self.body(self.embed(tokens) + self.position[: tokens.shape[1]], mask=mask, is_causal=True))

    def training_step(self, batch, batch_idx):
        (tokens,) = batch
        logits = self(tokens[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

    def configure_optimizers(self):
        decay = [p for n, p in self.named_parameters() if p.ndim >= 2 and "position" not in n]
        rest = [p for n, p in self.named_parameters() if not (p.ndim >= 2 and "position" not in n)]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
            lr=3e-3,
            **{self.kernel: True},
        )
        warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 3))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


def lm(seed=0, **kwargs) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(**kwargs)


def tokens() -> DataLoader:
    g = torch.Generator().manual_seed(3)
    return DataLoader(TensorDataset(torch.randint(0, VOCAB, (48, LENGTH + 1), generator=g)), batch_size=8)


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_two_copies_in_lockstep_measure_exactly_zero(tmp_path):
    pl.seed_everything(0, verbose=False)
    pair = LockstepPair(lm(), lm(), out=tmp_path, every=1, name="tiny-lm-control", category="control")
    trainer(STEPS).fit(pair, tokens())
    store = MetricsStore(tmp_path)
    assert store.steps() == list(range(STEPS + 1))
    assert all(r["max_abs_diff"] == 0.0 and r["loss_a"] == r["loss_b"] for r in store.step_records()[1:])
    assert all(r["max_abs_diff"] == 0.0 for r in store.tensor_records())
    assert not torch.equal(pair.module_a.head.weight, lm().head.weight)  # it did train


def test_two_trainers_with_arm_checkpoints_and_watch_equal_lockstep(tmp_path, capsys):
    for arm, kernel in (("a", "foreach"), ("b", "fused")):
        pl.seed_everything(0, verbose=False)
        callback = ArmCheckpoints(tmp_path / "separate", arm, every=2, name="tiny-lm-adamw", dense=[])
        trainer(STEPS, [callback]).fit(lm(kernel=kernel), tokens())
    assert (
        main(["watch", str(tmp_path / "separate"), "--no-wandb", "--quiet", "--poll", "0.05", "--timeout", "20"]) == 0
    )
    assert "next: a verdict needs this pair beside a precision pair" in capsys.readouterr().out
    pl.seed_everything(0, verbose=False)
    pair = LockstepPair(
        lm(kernel="foreach"), lm(kernel="fused"), out=tmp_path / "lockstep", every=2, name="tiny-lm-adamw", dense=[]
    )
    trainer(STEPS).fit(pair, tokens())
    separate, lockstep = records(tmp_path / "separate"), records(tmp_path / "lockstep")
    assert separate == lockstep
    tracked = [r for r in separate if r["type"] == "step" and r["tracked"]]
    assert [r["step"] for r in tracked] == [0, 2, 4, 6]
    assert tracked[0]["max_abs_diff"] == 0.0 and tracked[-1]["max_abs_diff"] > 0  # fused AdamW rounds otherwise
