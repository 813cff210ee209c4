"""Real short runs of a tiny causal LM through the public ``ArmWriter``, for the verdict's readings.

The model predicts each next token of padded, variable-length sequences from the token before it
(an embedding, a residual MLP with a wide LayerNorm, a head: a bigram LM), trained with AdamW in fp32; the
per-token cross-entropy is masked at the padding. Two studies, each pair's arms written by
``ArmWriter`` and compared by ``watch``'s comparator, as a user's own loop would be:

``finetune_study``: every arm starts from the same pretrained weights (a fine-tune). The pair under
study is a tiny fp32 optimizer change (arm a's gradients multiplied and divided by 3 before each
step, as a static loss scale of 3 is undone: a rounding-level change); beside it bf16-vs-fp32 (arm a under
bf16 autocast), a data-order seed pair and a control. No reordering pair.

``accumulation_study``: from scratch. Gradient accumulation of 4 micro-batches of 4 sequences
against one batch of 16: the fix normalizes the loss by all tokens of the accumulated batch (the
same sums as one batch, in another order), the bug averages the micro-batches' token means (other
weights for the tokens of short sequences); beside them bf16-vs-fp32, an init seed pair, a
reordering pair (one batch, its sequences in reverse order) and a control. The arms carry the
labels a user would write (``loss=ga-buggy``), which name no registered variant; both accumulation
pairs declare that their change should be the identity (``expect_identity=True``).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from divergence.comparator.follow import Comparator
from divergence.writers import ArmWriter

VOCAB, DIM, HIDDEN, LENGTH, BATCH, MICRO = 32, 16, 256, 12, 16, 4
START = "sha256:tiny-bigram-lm-pretrained"


class TinyLM(torch.nn.Module):
    """Embedding (GPT-like init, std 0.02), a residual MLP whose wide LayerNorm's gains dominate the
    weights' norm (a seed change's E is then about 1, as in larger LMs), a head."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        torch.nn.init.normal_(self.emb.weight, std=0.02)
        self.up, self.norm, self.down = (
            torch.nn.Linear(DIM, HIDDEN),
            torch.nn.LayerNorm(HIDDEN),
            torch.nn.Linear(HIDDEN, DIM),
        )
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        h = self.emb(tokens)
        return self.head(h + self.down(F.gelu(self.norm(self.up(h)))))


def corpus(n: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of a noisy affine-map language, 3 to ``LENGTH`` tokens each, padded; (tokens, mask)."""
    g = torch.Generator().manual_seed(7)
    tokens = torch.zeros(n, LENGTH, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for i in range(1, LENGTH):
        noise = torch.randint(0, VOCAB, (n,), generator=g)
        tokens[:, i] = torch.where(torch.rand(n, generator=g) < 0.2, noise, (3 * tokens[:, i - 1] + 5) % VOCAB)
    lengths = torch.randint(3, LENGTH + 1, (n,), generator=g)
    return tokens, torch.arange(LENGTH)[None, :] < lengths[:, None]


DATA = corpus()


def batches(seed: int, steps: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, DATA[0].shape[0], (BATCH,), generator=g) for _ in range(steps)]


def token_losses(model, idx, bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token losses of sequences ``idx`` (next-token, fp32) and the mask of real targets."""
    tokens, mask = DATA[0][idx], DATA[1][idx]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(tokens[:, :-1])
    losses = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1), reduction="none")
    return losses.view(len(idx), -1), mask[:, 1:].float()


def backward(model, idx, how: str, bf16: bool = False) -> float:
    """One step's gradient over batch ``idx``: ``one`` batch (the token mean), ``reversed`` (its
    sequences in reverse order), ``fix`` / ``bug`` (4 micro-batches of 4, accumulated)."""
    if how in ("one", "reversed"):
        losses, mask = token_losses(model, idx.flip(0) if how == "reversed" else idx, bf16)
        loss = (losses * mask).sum() / mask.sum()
        loss.backward()
        return loss.item()
    total, chunks = DATA[1][idx][:, 1:].sum(), idx.chunk(BATCH // MICRO)
    value = 0.0
    for chunk in chunks:
        losses, mask = token_losses(model, chunk, bf16)
        if how == "fix":  # every token weighs 1 / (tokens of the accumulated batch)
            loss = (losses * mask).sum() / total
        else:  # the bug: the mean of the micro-batches' token means
            loss = (losses * mask).sum() / mask.sum() / len(chunks)
        loss.backward()
        value += loss.item()
    return value


def train_arm(writer: ArmWriter, start: dict, data_seed: int, steps: int, lr: float, **change) -> None:
    """One arm: from ``start`` with AdamW(lr), on the batches of ``data_seed``, ``change`` its one
    difference (``bf16``, ``how``, ``fused``, ``scale``)."""
    model = TinyLM()
    model.load_state_dict(start)
    fused = change.get("fused", False)
    opt = torch.optim.AdamW(model.parameters(), lr, fused=fused, foreach=not fused)
    writer.record(0, model)
    for step, idx in enumerate(batches(data_seed, steps), 1):
        opt.zero_grad()
        loss = backward(model, idx, change.get("how", "one"), change.get("bf16", False))
        scale = change.get("scale")
        for p in model.parameters() if scale else ():  # a static loss scale's unscaling, in fp32
            p.grad.mul_(scale).div_(scale)
        opt.step()
        writer.record(step, model, loss)
    writer.finish()


def initial(seed: int) -> dict:
    torch.manual_seed(seed)
    return {k: v.clone() for k, v in TinyLM().state_dict().items()}


def pretrained(steps: int = 150) -> dict:
    model = TinyLM()
    model.load_state_dict(initial(0))
    opt = torch.optim.AdamW(model.parameters(), 3e-3)
    for idx in batches(99, steps):
        opt.zero_grad()
        backward(model, idx, "one")
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def write_pair(folder: Path, runs: tuple[tuple[dict, int, dict], tuple[dict, int, dict]], steps, lr, **pair):
    """Both arms of one pair run (``(start, data seed, change)`` each), then its metrics store."""
    for arm, (start, data_seed, change) in zip("ab", runs):
        train_arm(ArmWriter(folder, arm, max_steps=steps, **pair), start, data_seed, steps, lr, **change)
    assert Comparator(folder, log=False, progress=False).run(poll=0.01, timeout=60) == 0


FINETUNE = {  # name: (category, arm a's change, arm b's change)
    "loss-scale": ("optimization", {"scale": 3.0}, {}),
    "bf16-vs-fp32": ("precision", {"bf16": True}, {}),
    "data-order": ("seed", {"data_seed": 1}, {}),
    "control": ("control", {}, {}),
}


def finetune_study(root: Path, replicates: int = 3, steps: int = 30, lr: float = 1e-3) -> Path:
    start = pretrained()
    for r in range(replicates):
        for name, (category, a, b) in FINETUNE.items():
            if category == "control" and r:
                continue
            arms = tuple(
                (start, 100 * r + c.get("data_seed", 0), {k: v for k, v in c.items() if k != "data_seed"})
                for c in (a, b)
            )
            write_pair(root / f"{name}-r{r}", arms, steps, lr, name=name, category=category, replicate=r, start=START)
    return root


ACCUMULATION = {  # name: (category, arm a's change, arm b's change, labels)
    "ga-bug": ("optimization", {"how": "bug"}, {}, {"a": ["loss=ga-buggy"], "b": ["loss=one-batch"]}),
    "ga-fix": ("optimization", {"how": "fix"}, {}, {"a": ["loss=ga-fixed"], "b": ["loss=one-batch"]}),
    "bf16-vs-fp32": ("precision", {"bf16": True}, {}, None),
    "seed": ("seed", {"init": 1000}, {}, None),
    "reversed-batch": ("reordering", {"how": "reversed"}, {}, None),
    "control": ("control", {}, {}, None),
}


def accumulation_study(root: Path, replicates: int = 3, steps: int = 30, lr: float = 0.015, identity=True) -> Path:
    for r in range(replicates):
        for name, (category, a, b, labels) in ACCUMULATION.items():
            if category == "control" and r:
                continue
            arms = tuple(
                (initial(r + c.get("init", 0)), 100 * r, {k: v for k, v in c.items() if k != "init"}) for c in (a, b)
            )
            declared = {"expect_identity": identity} if category == "optimization" and identity is not None else {}
            write_pair(
                root / f"{name}-r{r}",
                arms,
                steps,
                lr,
                name=name,
                category=category,
                replicate=r,
                arms=labels,
                **declared,
            )
    return root
