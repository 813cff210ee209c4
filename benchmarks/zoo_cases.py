"""The bug zoo's cases: bugs from public history and legitimate reorderings, on a tiny GPT-2 built locally.

Every case is a pair of code paths that should compute the same training step: the baseline (one process,
the whole batch, the loss a token mean over the batch's valid tokens, clipped at ``CLIP``, AdamW foreach,
linear warm-up stepped once per optimizer step) and a change. Ranks, tensor-parallel shards and
micro-batches are emulated in one process: each rank's or shard's part is computed on its own and summed
in rank order, as the all-reduce would. A gradient path is ``path(model, batch) -> loss`` and leaves the
gradient the optimizer sees in the parameters' ``.grad``.

Batches hold rows of different lengths (padding masked out of the loss), so normalizations that are
right only for equal lengths (a mean of per-rank or per-micro-batch means) show as the bugs they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F

VOCAB, SEQ, ROWS, WIDTH = 50, 16, 8, 32  # VOCAB divides by 2, not by 4
LR, WARMUP, CLIP, SCALE = 1e-3, 20, 1.0, 2.0**10
UNREDUCED = "transformer.ln_f.weight"  # the parameter left out of the all-reduce


def make_model() -> torch.nn.Module:
    """A 2-layer GPT-2 (width 32, 50 tokens, 16 positions, no dropout), the same weights every call."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=WIDTH, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).train()


def make_batch(step: int, rows: int = ROWS) -> dict:
    """Step ``step``'s batch: ``ids`` (rows, SEQ) arithmetic sequences mod VOCAB (learnable), ``mask``
    (rows, SEQ) 1 on each row's first 8-16 tokens (its length), 0 on its padding."""
    g = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, VOCAB, (rows, 1), generator=g)
    stride = torch.randint(1, 4, (rows, 1), generator=g)
    ids = (start + stride * torch.arange(SEQ)) % VOCAB
    lengths = torch.randint(SEQ // 2, SEQ + 1, (rows,), generator=g)
    return {"ids": ids, "mask": (torch.arange(SEQ) < lengths[:, None]).float()}


def rows_of(batch: dict, parts: int) -> list[dict]:
    """The batch's rows cut into ``parts`` consecutive slices (ranks or micro-batches)."""
    ids, mask = batch["ids"].tensor_split(parts), batch["mask"].tensor_split(parts)
    return [{"ids": i, "mask": m} for i, m in zip(ids, mask)]


def tokens(batch: dict) -> torch.Tensor:
    return batch["mask"][:, 1:].sum()


def hidden(model, batch) -> torch.Tensor:
    return model.transformer(input_ids=batch["ids"]).last_hidden_state  # (B, T, D)


def token_ce(model, batch) -> torch.Tensor:
    """Per-token cross-entropy of next-token prediction, 0 on padding: (B, T-1)."""
    logits = hidden(model, batch) @ model.lm_head.weight.T  # (B, T, V)
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["ids"][:, 1:].flatten(), reduction="none")
    return ce.view(logits.shape[0], -1) * batch["mask"][:, 1:]


def clip(model) -> None:
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)


def baseline(model, batch, micro: int = 1, reverse: bool = False) -> float:
    """The reference path: the global token mean, over ``micro`` micro-batches (last first if ``reverse``)."""
    total, loss = tokens(batch), 0.0
    parts = rows_of(batch, micro)
    for part in reversed(parts) if reverse else parts:
        part_loss = token_ce(model, part).sum() / total
        part_loss.backward()
        loss += float(part_loss.detach())
    clip(model)
    return loss


def ranks(model, batch, world: int, keep_local: str | None = None, rank_mean: bool = False) -> float:
    """Data parallel over ``world`` emulated ranks: each rank's gradient on its rows, averaged in rank order.

    Right: rank r's loss is world * (its token sum) / (all ranks' tokens), the token count all-reduced
    first. ``rank_mean``: each rank's own token mean instead (a mean of per-rank means). ``keep_local``:
    that parameter keeps rank 0's gradient (left out of the all-reduce)."""
    params = dict(model.named_parameters())
    total, grads, loss = tokens(batch), [], 0.0
    for part in rows_of(batch, world):
        model.zero_grad(set_to_none=True)
        ce = token_ce(model, part)
        part_loss = ce.sum() / tokens(part) if rank_mean else world * ce.sum() / total
        part_loss.backward()
        grads.append({n: p.grad.clone() for n, p in params.items()})
        loss += float(part_loss.detach()) / world
    all_reduce(params, grads, world, keep_local)
    clip(model)
    return loss


def all_reduce(params: dict, grads: list[dict], world: int, keep_local: str | None = None) -> None:
    """Each parameter's ``.grad``: the ranks' gradients summed in rank order over ``world`` (the
    all-reduce's mean); ``keep_local``: that parameter keeps rank 0's gradient (left out of it)."""
    for name, p in params.items():
        summed = grads[0][name]
        for g in grads[1:]:
            summed = summed + g[name]
        p.grad = grads[0][name] if name == keep_local else summed / world


def uneven_rank_means(model, batch) -> float:
    """An uneven last batch: ranks of 5 and 3 rows, the loss the mean of the two ranks' means."""
    params = dict(model.named_parameters())
    parts = [{k: v[:5] for k, v in batch.items()}, {k: v[5:] for k, v in batch.items()}]
    grads, loss = [], 0.0
    for part in parts:
        model.zero_grad(set_to_none=True)
        part_loss = token_ce(model, part).sum() / tokens(part)
        part_loss.backward()
        grads.append({n: p.grad.clone() for n, p in params.items()})
        loss += float(part_loss.detach()) / 2
    for name, p in params.items():
        p.grad = (grads[0][name] + grads[1][name]) / 2
    clip(model)
    return loss


def accumulation_token_mean(model, batch, micro: int = 4) -> float:
    """Gradient accumulation with each micro-batch's own token mean divided by the micro-batch count."""
    loss = 0.0
    for part in rows_of(batch, micro):
        part_loss = token_ce(model, part).sum() / tokens(part) / micro
        part_loss.backward()
        loss += float(part_loss.detach())
    clip(model)
    return loss


def clip_before_unscale(model, batch) -> float:
    """fp16-style loss scaling with the still-scaled gradients clipped, then unscaled (the scale is a power of
    two, so in fp32 scaling and unscaling are exact: only the clip's order differs)."""
    loss = token_ce(model, batch).sum() / tokens(batch)
    (loss * SCALE).backward()
    clip(model)
    for p in model.parameters():
        p.grad /= SCALE
    return float(loss.detach())


def vocab_parallel(model, batch, tp: int, mask_padding: bool = True) -> float:
    """Vocab-parallel cross-entropy over ``tp`` shards of the (padded) vocabulary, as Megatron computes it:
    the max all-reduced, each shard's sum of exp all-reduced (summed in rank order), the target's logit
    taken from its shard. The vocabulary is padded to a multiple of ``tp`` with zero rows; their logits
    are masked out (-inf) unless ``mask_padding`` is False."""
    weight = model.lm_head.weight  # (V, D)
    padded = math.ceil(VOCAB / tp) * tp
    weight = torch.cat([weight, weight.new_zeros(padded - VOCAB, weight.shape[1])])
    logits = (hidden(model, batch) @ weight.T)[:, :-1]  # (B, T-1, Vp)
    if mask_padding and padded > VOCAB:
        logits = torch.cat([logits[..., :VOCAB], torch.full_like(logits[..., VOCAB:], -math.inf)], dim=-1)
    shards = logits.split(padded // tp, dim=-1)
    top = torch.stack([s.max(-1).values for s in shards]).max(0).values.detach()  # (B, T-1)
    sum_exp = sum((s - top[..., None]).exp().sum(-1) for s in shards)
    target = logits.gather(-1, batch["ids"][:, 1:, None]).squeeze(-1) - top
    ce = (sum_exp.log() - target) * batch["mask"][:, 1:]
    loss = ce.sum() / tokens(batch)
    loss.backward()
    clip(model)
    return float(loss.detach())


@dataclass
class Arm:
    """One arm's training: its gradient path and what else differs from the baseline."""

    grad: Callable = baseline
    fused: bool = False  # AdamW's fused kernel instead of foreach
    micro_steps: int = 1  # scheduler steps per optimizer step (the per-micro-batch scheduler bug: 4)
    restart_at: int | None = None  # the scheduler rebuilt from scratch after this step (a resume that lost it)
    checkpointing: bool = False  # activation checkpointing
    compile: bool = False  # torch.compile of the transformer


@dataclass
class Case:
    """A pair with its truth: ``bug`` True for a bug, False for a legitimate change; ``one_step`` whether a
    single step can show it (False: it shows only across steps)."""

    name: str
    bug: bool
    source: str
    arm: Arm
    one_step: bool = True
    ranks: bool = False  # trained as real 2-rank gloo arms against DDP (zoo_distributed), not by ``train``
    backbone: str = "gpt2"  # the module that trains it: "gpt2" this one, "unet" zoo_unet
    description: str = ""
    extra: dict = field(default_factory=dict)


def warmup(step: int) -> float:
    return min(1.0, (step + 1) / WARMUP)


def make_optimizer(model, fused: bool):
    kernel = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01, **kernel)


def train(arm: Arm, steps: int, on_step: Callable) -> None:
    """Train a fresh model ``steps`` optimizer steps as ``arm`` says; ``on_step(step, model, loss)`` after
    each (step 0: the initial weights, loss None)."""
    model = make_model()
    if arm.checkpointing:
        checkpointing(model, True)
    if arm.compile:
        model.transformer.compile()
    optimizer = make_optimizer(model, arm.fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
    on_step(0, model, None)
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = arm.grad(model, make_batch(step))
        optimizer.step()
        for _ in range(arm.micro_steps):
            scheduler.step()
        if arm.restart_at == step:  # resumed here with the model and optimizer, the scheduler built anew
            for group in optimizer.param_groups:
                group["lr"] = group["initial_lr"]
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
        on_step(step, model, loss)


def _gradient_only(fn: Callable) -> Callable:
    """A zoo gradient path as a one-step path: the gradient is left in ``.grad`` (returns None)."""

    def path(model, batch):
        fn(model, batch)

    return path


def _with_checkpointing(model, batch) -> float:
    checkpointing(model, True)
    try:
        return baseline(model, batch)
    finally:
        checkpointing(model, False)


def _compiled(model, batch) -> float:
    """The baseline with the transformer compiled (``torch.compile``, inductor), the eager one put back after."""
    eager = model.transformer
    model.transformer = torch.compile(eager)
    try:
        return baseline(model, batch)
    finally:
        model.transformer = eager


def checkpointing(model, on: bool) -> None:
    """Activation checkpointing on or off (transformers' newer name where it has one)."""
    name = "activation_checkpointing" if hasattr(model, "activation_checkpointing_enable") else "gradient_checkpointing"
    if on:
        getattr(model, f"{name}_enable")(**{f"{name}_kwargs": {"use_reentrant": False}})
    else:
        getattr(model, f"{name}_disable")()


def _grad_of(arm: Arm) -> Callable:
    return _with_checkpointing if arm.checkpointing else _compiled if arm.compile else arm.grad


def update_path(fused: bool, grad: Callable, state: dict) -> Callable:
    """AdamW's update (new weights - old) after ``grad``, from optimizer state ``state``."""

    def path(model, batch):
        grad(model, batch)
        optimizer = make_optimizer(model, fused)
        optimizer.load_state_dict(state)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        return {n: p.detach() - before[n] for n, p in model.named_parameters()}

    return path


def warmed(steps: int = 3) -> tuple[torch.nn.Module, dict]:
    """The baseline after ``steps`` steps and its optimizer's state (an update is read where AdamW's moments
    are past their first step, whose update is lr * sign(g) whatever the sums' order)."""
    out = {}

    def keep(step, model, loss):
        out["model"] = model

    model = make_model()
    optimizer = make_optimizer(model, False)
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        baseline(model, make_batch(step))
        optimizer.step()
    return model, {"state": optimizer.state_dict()}


REFERENCE_SPLITS = (2, 4, 8)  # the zoo's reordered references: the baseline over k micro-batches, last first


def one_step_args(case: Case) -> dict:
    """``one_step_check``'s arguments for ``case``: change, baseline, reordered, model, batch, kind."""
    refs = [partial(baseline, micro=k, reverse=True) for k in REFERENCE_SPLITS]
    batch = make_batch(1)
    if case.arm.fused:
        model, state = warmed()
        return {
            "change": update_path(True, baseline, state["state"]),
            "baseline": update_path(False, baseline, state["state"]),
            "reordered": [update_path(False, r, state["state"]) for r in refs],
            "model": model, "batch": batch, "kind": "update",
        }  # fmt: skip
    return {
        "change": _gradient_only(_grad_of(case.arm)),
        "baseline": _gradient_only(baseline),
        "reordered": [_gradient_only(r) for r in refs],
        "model": make_model(), "batch": batch, "kind": "gradient",
    }  # fmt: skip


CASES = [
    Case("vocab-parallel-unmasked", True, "Megatron-LM #1754: vocabulary padded to a multiple of TP, padded "
         "logits not masked", Arm(grad=partial(vocab_parallel, tp=4, mask_padding=False))),
    Case("unreduced-param", True, "divergence's injected bug (variants.parallel): one parameter left out of "
         "the gradient all-reduce", Arm(grad=partial(ranks, world=2, keep_local=UNREDUCED))),
    Case("clip-before-unscale", True, "PyTorch AMP examples, 'Gradient clipping': unscale_ before clipping; "
         "clipping the scaled gradients clips at a threshold S times too small", Arm(grad=clip_before_unscale)),
    Case("uneven-rank-means", True, "(x1/n1 + x2/n2)/2 != (x1 + x2)/(n1 + n2): the loss a mean of per-rank "
         "means with ranks of 5 and 3 examples (torchtune PR #1875)", Arm(grad=uneven_rank_means)),
    Case("accumulation-token-mean", True, "transformers #35203, HF blog 'gradient accumulation' (2024): each "
         "micro-batch's own token mean / K", Arm(grad=accumulation_token_mean)),
    Case("scheduler-per-micro-batch", True, "the LR scheduler stepped per micro-batch under 4x accumulation",
         Arm(grad=partial(baseline, micro=4), micro_steps=4), one_step=False),
    Case("resume-without-scheduler", True, "IntelLabs/distiller #70, lightly-ai/lightly-train PR #301: a resume "
         "at step 10 restores model and optimizer, the LR schedule starts again", Arm(restart_at=10),
         one_step=False),
    Case("data-parallel-2", False, "2 ranks, token count all-reduced: the same mean gradient",
         Arm(grad=partial(ranks, world=2))),
    Case("data-parallel-4", False, "4 ranks, token count all-reduced", Arm(grad=partial(ranks, world=4))),
    Case("grad-accumulation-4", False, "4 micro-batches normalized by the step's token count",
         Arm(grad=partial(baseline, micro=4))),
    Case("tensor-parallel-2", False, "vocab-parallel cross-entropy over 2 shards, 50 tokens divide by 2",
         Arm(grad=partial(vocab_parallel, tp=2))),
    Case("adamw-fused", False, "fused vs foreach AdamW: the same update in another operation order",
         Arm(fused=True)),
    Case("activation-checkpointing", False, "the forward recomputed in the backward: the same operations",
         Arm(checkpointing=True)),
    Case("torch-compile", False, "torch.compile (inductor's C++ kernels on the CPU) of the transformer vs eager: "
         "fused kernels that compute the same sums in another order", Arm(compile=True)),
    Case("fsdp-vs-ddp", False, "FSDP2 (torch.distributed.fsdp.fully_shard) vs DDP, 2 gloo ranks: weights, gradients "
         "and optimizer state sharded, gradients reduce-scattered (torchtitan PR #3847: FSDP vs HSDP 'a benign "
         "reduction-order effect')", Arm(), ranks=True),
    Case("zero-1", False, "ZeRO stage 1 (Rajbhandari et al. 2020; torch.distributed.optim.ZeroRedundancyOptimizer) "
         "vs DDP, 2 gloo ranks: AdamW's state and step sharded, each partition broadcast", Arm(), ranks=True),
]  # fmt: skip
