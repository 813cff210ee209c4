"""Does bf16 flash attention's biased rounding destabilize training at a scale that runs here?

    nice -n 10 python benchmarks/bench_bias_repro.py --out /tmp/bias-repro [--steps 20000]
        [--minutes 40] [--lr 3e-3] [--every 10]

An attempt to reproduce Qiu and Yao (arXiv 2510.04212, 2025): GPT-2 small trained with bf16
flash attention loses its loss to an explosion, because, when several scores of a row tie at the
row maximum, ``exp(s - m) = 1`` exactly for them and the bf16 rounding of ``P`` in ``P V`` errs
with one sign; their row-maximum change removes the bias. Here: a tiny causal language model
(2 layers, width 64, 2 heads, no positional embedding) on a synthetic corpus of long runs of a
few tokens (a sticky Markov chain over 8 symbols), so keys repeat exactly and scores tie at the
row maximum from the first step, as the paper's low-rank representations make them tie late in
training. bf16 autocast is emulated on the CPU (``divergence.training.emulated_autocast``:
linear layers as a GPU's tensor cores round them). Three arms from the same initial weights, on
the same batches:

- ``baseline``: the unfused reference attention (``baseline_attention``) under bf16 autocast,
- ``flash``: the tiled FlashAttention-2 re-implementation, kernel-faithful (fp32 ``S, m, l, O``,
  ``P`` rounded to bf16 before ``P V``; FlashAttention-2's backward), tiles 16 x 32,
- ``flash-unbiased``: the same with Qiu and Yao's row-maximum change.

Every ``--every`` steps, on the flash arm's own weights and batch, the per-step update error
``e_t = g_flash - g_baseline`` (the gradient with flash attention minus with the reference
attention; ``divergence.metrics.coherence``) and the same for flash-unbiased; the coherence C(T)
and mean consecutive cosine of those sequences show whether the statistic flags the flash error
as drifting before any loss explosion. Each arm's loss at every step goes to ``OUT/log.jsonl``,
the coherence to ``OUT/coherence.jsonl``; the state (weights, optimizer, step, error sums) is
saved to ``OUT/state.pt`` every ``--save-every`` steps and at the end, and the same command
resumes from it (a run that stops mid-way continues; its log is cut back to the saved step).
Runs until ``--steps`` or ``--minutes`` of wall time. ``--summary`` prints what the log holds.
What it showed on this machine: docs/bias.md.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from divergence.attention.reference import baseline_attention
from divergence.attention.tiled_backward import trainable_flash_attention
from divergence.training.emulated_autocast import emulate_cpu_autocast

ARMS = ("baseline", "flash", "flash-unbiased")
TILES = {"block_q": 16, "block_kv": 32, "accumulate": torch.float32}


def attend(arm: str, q, k, v):
    """(B, H, L, D) causal attention as arm ``arm`` computes it, under the caller's autocast."""
    if arm == "baseline":
        return baseline_attention(q, k, v, causal=True)
    return trainable_flash_attention(q, k, v, causal=True, unbiased=arm == "flash-unbiased", **TILES)


class TinyLM(torch.nn.Module):
    """A 2-layer pre-norm causal transformer without positional embedding (repeated tokens give
    identical keys: exact ties at the row maximum)."""

    def __init__(self, vocab=8, width=64, heads=2, layers=2):
        super().__init__()
        self.heads, self.kernel = heads, "baseline"
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict(
                {
                    "norm1": torch.nn.LayerNorm(width),
                    "qkv": torch.nn.Linear(width, 3 * width),
                    "proj": torch.nn.Linear(width, width),
                    "norm2": torch.nn.LayerNorm(width),
                    "up": torch.nn.Linear(width, 4 * width),
                    "down": torch.nn.Linear(4 * width, width),
                }
            )
            for _ in range(layers)
        )
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens):  # tokens: (B, L) -> logits (B, L, vocab)
        x = self.embed(tokens)
        b, length, width = x.shape
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["norm1"](x)).view(b, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            a = attend(self.kernel, q, k, v)  # (B, H, L, D)
            x = x + blk["proj"](a.transpose(1, 2).reshape(b, length, width))
            x = x + blk["down"](F.gelu(blk["up"](blk["norm2"](x))))
        return self.head(self.norm(x))


def batch(step: int, size=16, length=128, vocab=8, stay=0.9):
    """Step ``step``'s batch: runs of a sticky Markov chain (stay with probability ``stay``)."""
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.empty(size, length + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(vocab, (size,), generator=g)
    moves = torch.rand(size, length, generator=g) > stay
    jumps = torch.randint(1, vocab, (size, length), generator=g)
    for i in range(length):
        tokens[:, i + 1] = torch.where(moves[:, i], (tokens[:, i] + jumps[:, i]) % vocab, tokens[:, i])
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model, kernel: str, x, y):
    model.kernel = kernel
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def gradient(model, kernel: str, x, y) -> torch.Tensor:
    grads = torch.autograd.grad(loss_of(model, kernel, x, y), list(model.parameters()))
    return torch.cat([g.double().flatten() for g in grads])


def fresh_state(lr: float) -> dict:
    torch.manual_seed(0)
    init = TinyLM()
    emulate_cpu_autocast(init)
    models = {arm: TinyLM() for arm in ARMS}
    state = {"step": 0, "models": {}, "optims": {}, "sums": {}}
    for arm, m in models.items():
        emulate_cpu_autocast(m)
        m.load_state_dict(init.state_dict())
        state["models"][arm] = m
        state["optims"][arm] = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.0)
    return state


class ErrorSums:
    """Running ``sum e_t``, ``sum ||e_t||^2`` and consecutive cosines: C(T) without the sequence."""

    def __init__(self, n: int):
        self.total, self.energy, self.last, self.cos_sum, self.cos_n, self.steps = (
            torch.zeros(n, dtype=torch.float64),
            0.0,
            None,
            0.0,
            0,
            0,
        )

    def add(self, e: torch.Tensor) -> dict:
        self.total += e
        self.energy += float(e.square().sum())
        if self.last is not None and float(e.norm()) > 0 and float(self.last.norm()) > 0:
            self.cos_sum += float(e @ self.last) / float(e.norm() * self.last.norm())
            self.cos_n += 1
        self.last, self.steps = e, self.steps + 1
        c = float(self.total.norm()) / math.sqrt(self.energy) if self.energy > 0 else float("nan")
        return {"C": c, "mean_cos": self.cos_sum / self.cos_n if self.cos_n else float("nan"), "T": self.steps}

    def state(self) -> dict:
        return {k: getattr(self, k) for k in ("total", "energy", "last", "cos_sum", "cos_n", "steps")}


def save(out: Path, state: dict) -> None:
    data = {
        "step": state["step"],
        "models": {a: m.state_dict() for a, m in state["models"].items()},
        "optims": {a: o.state_dict() for a, o in state["optims"].items()},
        "sums": {a: s.state() for a, s in state["sums"].items()},
    }
    torch.save(data, out / "state.tmp")
    (out / "state.tmp").replace(out / "state.pt")


def load(out: Path, state: dict) -> None:
    data = torch.load(out / "state.pt", weights_only=True)  # our own file: tensors, numbers, dicts
    state["step"] = data["step"]
    for arm in ARMS:
        state["models"][arm].load_state_dict(data["models"][arm])
        state["optims"][arm].load_state_dict(data["optims"][arm])
    for arm, saved in data["sums"].items():
        for k, v in saved.items():
            setattr(state["sums"][arm], k, v)
    for name in ("log.jsonl", "coherence.jsonl"):  # cut what was written after the saved step
        path = out / name
        if path.is_file():
            keep = [ln for ln in path.read_text().splitlines() if json.loads(ln)["step"] <= state["step"]]
            path.write_text("".join(ln + "\n" for ln in keep))


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    state = fresh_state(args.lr)
    n = sum(p.numel() for p in state["models"]["flash"].parameters())
    state["sums"] = {arm: ErrorSums(n) for arm in ("flash", "flash-unbiased")}
    if (out / "state.pt").is_file():
        load(out, state)
        print(f"resumed at step {state['step']}", flush=True)
    start = time.monotonic()
    with open(out / "log.jsonl", "a") as log, open(out / "coherence.jsonl", "a") as coh:
        while state["step"] < args.steps and time.monotonic() - start < 60 * args.minutes:
            step = state["step"]
            x, y = batch(step)
            if step % args.every == 0:  # on the flash arm's own weights and batch
                flash_model = state["models"]["flash"]
                reference = gradient(flash_model, "baseline", x, y)
                record = {"step": step, "grad_norm": float(reference.norm())}
                for kernel, sums in state["sums"].items():
                    e = gradient(flash_model, kernel, x, y) - reference
                    record[kernel] = {**sums.add(e), "rel_err": float(e.norm() / reference.norm())}
                coh.write(json.dumps(record) + "\n")
            losses = {}
            for arm in ARMS:
                model, opt = state["models"][arm], state["optims"][arm]
                loss = loss_of(model, arm, x, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses[arm] = float(loss.detach())
            log.write(json.dumps({"step": step, **losses}) + "\n")
            state["step"] = step + 1
            if state["step"] % args.save_every == 0:
                log.flush(), coh.flush()
                save(out, state)
            if step % 500 == 0:
                print(f"step {step}: {losses} ({time.monotonic() - start:.0f} s)", flush=True)
    save(out, state)
    summary(out)


def summary(out: Path) -> None:
    log = [json.loads(ln) for ln in (out / "log.jsonl").read_text().splitlines()]
    coh = [json.loads(ln) for ln in (out / "coherence.jsonl").read_text().splitlines()]
    print(f"{len(log)} steps")
    window = 200
    for lo in range(0, len(log), max(window, len(log) // 10 // window * window)):
        part = log[lo : lo + window]
        means = {a: sum(r[a] for r in part) / len(part) for a in ARMS}
        print(f"  steps {lo}-{lo + len(part) - 1}: " + ", ".join(f"{a} {v:.4f}" for a, v in means.items()))
    for arm in ARMS:
        bad = next((r["step"] for r in log if not math.isfinite(r[arm]) or r[arm] > 2 * log[0][arm]), None)
        print(f"  {arm}: first non-finite or > 2x initial loss at step {bad}")
    for r in coh[:: max(1, len(coh) // 8)] + coh[-1:]:
        print(
            f"  coherence at step {r['step']}: "
            + ", ".join(
                f"{k} C={r[k]['C']:.2f} (sqrt T={math.sqrt(r[k]['T']):.1f}) cos={r[k]['mean_cos']:+.3f} "
                f"|e|/|g|={r[k]['rel_err']:.2e}"
                for k in ("flash", "flash-unbiased")
            )
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--minutes", type=float, default=40.0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--save-every", type=int, default=200)
    p.add_argument("--summary", action="store_true", help="print what OUT's log holds and stop")
    args = p.parse_args()
    summary(Path(args.out)) if args.summary else run(args)


if __name__ == "__main__":
    main()
