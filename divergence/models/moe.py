"""A mixture of experts in place of a diffusion transformer's MLPs (``model.moe``), in torch ops.

Each transformer block's dense MLP ``y = W2 gelu(W1 x + b1) + b2`` becomes ``E`` such MLPs
(experts) and a linear router. For the T tokens of a forward pass (batch x image tokens), with
router weights ``Wr`` (E x D)::

    p_t      = softmax(Wr x_t)                              router probabilities, (E,)
    S_t      = top_k(p_t)                                   the k experts of token t ("slots")
    g_ts     = p_ts / sum_{s' in S_t} p_ts'                 gates, renormalised over the k (k > 1)
    y_t      = sum_{s in S_t, kept} g_ts expert_s(x_t)

Capacity (GShard, Lepikhin et al. 2020, sec. 2.2; Switch Transformer, Fedus et al. 2021, sec. 2.2):
an expert takes at most ``C = ceil(capacity_factor * T * k / E)`` choices per forward pass; the
choices are queued slot by slot (every token's first choice, in token order, then every second
choice), and a choice past position C of its expert's queue is dropped: that slot adds nothing
(the token keeps its residual path). ``capacity_factor: null`` drops nothing.

Load balancing (Switch Transformer, eq. 4, counted over the k slots)::

    aux = E * sum_e f_e P_e,   f_e = #(choices of e) / (T k),   P_e = mean_t p_te

which is 1 when routing is uniform; ``balance_loss`` x aux (summed over blocks) is added to the
training loss (``divergence.training.arm``). The router's own record (which expert each slot
chose, which choices were dropped) is kept on each layer for ``divergence.metrics.router``
(docs/method.md).

Two ways to compute the experts, the same math in other orders of sums (``expert_compute``):
``grouped`` gathers the kept choices into an (E, C, D) buffer and runs one batched matmul, then
sums each token's slots in slot order; ``loop`` runs one matmul per expert over its own tokens and
adds their outputs expert by expert.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from divergence.recipe.model import MoEConfig


@dataclass(frozen=True)
class Routing:
    """Which expert each (token, slot) chose and whether capacity kept it (detached)."""

    experts: torch.Tensor  # (T, k) int64: the chosen experts, by falling probability
    kept: torch.Tensor  # (T, k) bool: False where the expert's capacity dropped the choice
    probs: torch.Tensor  # (T, E) float32: router probabilities


def capacity(tokens: int, top_k: int, experts: int, factor: float | None) -> int:
    """Choices one expert takes per forward pass: ``ceil(factor * tokens * top_k / experts)``,
    all of them (``tokens``) when ``factor`` is None.

    >>> capacity(512, 2, 4, 1.25), capacity(512, 2, 4, None)
    (320, 512)
    """
    if factor is None:
        return tokens
    return max(1, math.ceil(factor * tokens * top_k / experts))


def route(probs: torch.Tensor, top_k: int, slots: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(experts, position, kept)``, each (T, k), of router probabilities ``probs`` (T, E).

    ``position``: the choice's place in its expert's queue, which is filled slot by slot and in
    token order within a slot; ``kept = position < slots``.

    >>> p = torch.tensor([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.5, 0.1, 0.4]])
    >>> experts, position, kept = route(p, 1, 2)
    >>> experts.flatten().tolist(), position.flatten().tolist(), kept.flatten().tolist()
    ([0, 0, 0], [0, 1, 2], [True, True, False])
    """
    experts = torch.topk(probs, top_k, dim=-1).indices  # (T, k)
    position = queue_positions(experts, probs.shape[-1])
    return experts, position, position < slots


def queue_positions(experts: torch.Tensor, count: int) -> torch.Tensor:
    """(T, k) place of each choice of ``experts`` (T, k) in its expert's queue (of ``count``
    experts), filled slot by slot and in token order within a slot.

    >>> queue_positions(torch.tensor([[0, 1], [0, 2], [1, 0]]), 3).tolist()
    [[0, 1], [1, 0], [0, 2]]
    """
    onehot = F.one_hot(experts.t().reshape(-1), count)  # (k T, E), slot-major
    return (onehot.cumsum(0) - 1).mul_(onehot).sum(-1).reshape(experts.shape[1], -1).t()  # (T, k)


def balance_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Switch Transformer's load-balancing loss ``E sum_e f_e P_e`` of probs (T, E) and choices (T, k).

    >>> balance_loss(torch.full((4, 2), 0.5), torch.tensor([[0], [1], [0], [1]]))
    tensor(1.)
    """
    count = probs.shape[-1]
    f = torch.bincount(experts.reshape(-1), minlength=count).to(probs.dtype) / experts.numel()
    return count * torch.sum(f * probs.mean(0))


def experts_mlp(x, w1, b1, w2, b2) -> torch.Tensor:
    """Every expert on its own rows in one batched matmul: x (E, C, D) with weights (E, D, H),
    (E, H), (E, H, D), (E, D) -> (E, C, D)."""
    h = F.gelu(torch.baddbmm(b1[:, None], x, w1), approximate="tanh")
    return torch.baddbmm(b2[:, None], h, w2)


class MoEFeedForward(torch.nn.Module):
    """``experts`` GELU(tanh) MLPs of width ``hidden`` behind a top-k router, on (B, N, D) tokens."""

    def __init__(self, dim: int, hidden: int, config: MoEConfig):
        super().__init__()
        self.config = config
        count = config.experts
        self.router = torch.nn.Linear(dim, count, bias=False)
        # experts stacked: (E, D, H), (E, H), (E, H, D), (E, D); nn.Linear's initialisation per expert
        bound1, bound2 = 1 / math.sqrt(dim), 1 / math.sqrt(hidden)
        self.w1 = torch.nn.Parameter(torch.empty(count, dim, hidden).uniform_(-bound1, bound1))
        self.b1 = torch.nn.Parameter(torch.empty(count, hidden).uniform_(-bound1, bound1))
        self.w2 = torch.nn.Parameter(torch.empty(count, hidden, dim).uniform_(-bound2, bound2))
        self.b2 = torch.nn.Parameter(torch.empty(count, dim).uniform_(-bound2, bound2))
        self.aux_loss: torch.Tensor | None = None  # () the last forward's balance loss (with grad)
        self.routing: Routing | None = None  # the last forward's routing
        self.recorder: list[Routing] | None = None  # every forward's routing, while recording
        # the forward with the experts over ranks (``train.expert_parallel``), set when they are
        # sharded (``divergence.models.expert_parallel.shard_experts``); None: all experts here
        self.dispatch = None

    def router_probs(self, tokens: torch.Tensor) -> torch.Tensor:
        """(T, D) -> (T, E) router probabilities, float32; computed in fp32 with autocast off
        (``router_precision: fp32``) or in the autocast dtype, softmax included (``autocast``)."""
        if self.config.router_precision == "fp32":
            with torch.autocast(tokens.device.type, enabled=False):
                return torch.softmax(F.linear(tokens.float(), self.router.weight.float()), dim=-1)
        logits = self.router(tokens)  # under autocast: the autocast dtype
        with torch.autocast(tokens.device.type, enabled=False):
            return torch.softmax(logits, dim=-1).float()  # softmax in the logits' dtype

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if self.dispatch is not None:
            return self.dispatch(self, hidden_states)
        shape = hidden_states.shape
        tokens = hidden_states.reshape(-1, shape[-1])  # (T, D)
        probs = self.router_probs(tokens)
        k = self.config.top_k
        slots = capacity(tokens.shape[0], k, self.config.experts, self.config.capacity_factor)
        experts, position, kept = route(probs.detach(), k, slots)
        gates = probs.gather(1, experts)  # (T, k)
        if k > 1:
            gates = gates / gates.sum(-1, keepdim=True)
        gates = gates * kept
        self.aux_loss = balance_loss(probs, experts)
        self.routing = Routing(experts, kept, probs.detach())
        if self.recorder is not None:
            self.recorder.append(self.routing)
        compute = self._grouped if self.config.expert_compute == "grouped" else self._loop
        out = compute(tokens, experts, position, kept, gates.to(tokens.dtype), slots)
        return out.reshape(shape)

    def _mlp(self, x: torch.Tensor, e) -> torch.Tensor:
        """Expert(s) ``e`` on x: (n, D) with an int, or (E, C, D) with a slice of all."""
        if isinstance(e, int):
            h = F.gelu(torch.addmm(self.b1[e], x, self.w1[e]), approximate="tanh")
            return torch.addmm(self.b2[e], h, self.w2[e])
        return experts_mlp(x, self.w1, self.b1, self.w2, self.b2)

    def _grouped(self, tokens, experts, position, kept, gates, slots) -> torch.Tensor:
        """One batched matmul over an (E, C, D) buffer of the kept choices; slots summed in order."""
        count, dim = self.config.experts, tokens.shape[-1]
        flat = (experts * slots + position.clamp(max=slots - 1)).masked_fill(~kept, count * slots)  # (T, k)
        buffer = tokens.new_zeros(count * slots + 1, dim)  # one spare row takes the dropped choices
        for s in range(experts.shape[1]):
            buffer = buffer.index_copy(0, flat[:, s], tokens)
        out = self._mlp(buffer[:-1].reshape(count, slots, dim), slice(None)).reshape(count * slots, dim)
        out = torch.cat([out, out.new_zeros(1, dim)])
        result = gates[:, 0, None] * out[flat[:, 0]]
        for s in range(1, experts.shape[1]):
            result = result + gates[:, s, None] * out[flat[:, s]]
        return result

    def _loop(self, tokens, experts, position, kept, gates, slots) -> torch.Tensor:
        """One matmul per expert over its kept tokens, outputs added expert by expert."""
        result = torch.zeros_like(tokens)
        for e in range(self.config.experts):
            token, slot = torch.nonzero((experts == e) & kept, as_tuple=True)
            if token.numel():
                y = self._mlp(tokens[token], e) * gates[token, slot, None]
                result = result.index_add(0, token, y)
        return result


def apply_moe(transformer: torch.nn.Module, config: MoEConfig | None, seed: int) -> int:
    """Replace the MLP (``ff``) of every block in ``transformer.transformer_blocks`` by a
    :class:`MoEFeedForward`, seeded by ``(seed, "moe")``; return how many were replaced."""
    from divergence.models.build import seeded

    if config is None:
        return 0
    replaced = 0
    with seeded(seed, "moe"):
        for block in transformer.transformer_blocks:
            dense = block.ff
            linear = dense.net[0].proj  # diffusers FeedForward: GELU(dim -> inner).proj
            dim, inner = linear.in_features, linear.out_features
            width = config.expert_width or max(1, inner // config.top_k)
            block.ff = MoEFeedForward(dim, width, config)
            replaced += 1
    return replaced


def moe_layers(model: torch.nn.Module) -> dict[str, MoEFeedForward]:
    """The MoE layers of ``model`` by module name, in model order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, MoEFeedForward)}


def moe_aux_loss(model: torch.nn.Module) -> torch.Tensor | None:
    """``balance_loss`` x the sum of every MoE layer's last balance loss; None without MoE layers."""
    layers = [m for m in moe_layers(model).values() if m.aux_loss is not None]
    if not layers:
        return None
    return layers[0].config.balance_loss * torch.stack([m.aux_loss.float() for m in layers]).sum()


@contextlib.contextmanager
def recording_routes(model: torch.nn.Module):
    """Inside: every forward of each MoE layer appends its :class:`Routing`; yields
    ``{layer name: [Routing, ...]}`` (one entry per forward, in call order). After: each layer's
    last routing and balance loss as they were before, so the recorded forwards (the probe's, on
    its own inputs) leave no trace: a layer's ``routing`` stays its last training forward's, the
    one ``training.probe.training_drops`` reads (or None where the model never trained, e.g. arms
    read back from files at every probed step)."""
    layers = moe_layers(model)
    records: dict[str, list[Routing]] = {name: [] for name in layers}
    saved = {name: (layer.routing, layer.aux_loss) for name, layer in layers.items()}
    for name, layer in layers.items():
        layer.recorder = records[name]
    try:
        yield records
    finally:
        for name, layer in layers.items():
            layer.recorder = None
            layer.routing, layer.aux_loss = saved[name]
