"""Expert parallelism of a mixture of experts (``train.expert_parallel``): each MoE layer's experts
spread over the ranks, every token sent to its experts' ranks and back with all-to-all.

With W ranks and E experts (E a multiple of W), rank r holds experts ``[r E/W, (r+1) E/W)``
(expert e lives on rank ``e // (E/W)``): the stacked expert weights ``w1, b1, w2, b2`` become
DTensors sharded on dim 0 over the expert-parallel mesh (``torch.distributed.tensor``,
``Shard(0)``), so their full tensors are the 1-rank weights under the 1-rank names (what the
weights files and the resumable checkpoint hold, gathered as tensor parallelism's are). The router
and every other weight stay whole on every rank; each rank trains on its slice of the global
batch (rank r the examples ``[r B, (r+1) B)``), and ``divergence.training.expert_parallel``
averages the whole weights' gradients over the ranks.

One MoE layer's forward on rank r, its ``T_r`` tokens (GShard, Lepikhin et al. 2020, sec. 2.2 and
3.2; Switch Transformer, Fedus et al. 2021, sec. 2.2)::

    1 route     p = softmax(Wr x) (T_r, E) and the top-k choices, computed locally (row by row, the
                1-rank rows); the choices of every rank gathered (all_gather, no gradient) into the
                global (T, k), T = W T_r, rank 0's tokens first: the one-process token order
    2 capacity  C = capacity(T, k, E, factor) from the GLOBAL token count, and each global choice's
                place in its expert's queue (``moe.queue_positions``): one process's queue, so the
                same choices are dropped as on one rank
    3 dispatch  the kept choices' tokens sent to their experts' ranks (all_to_all_single), grouped by
                destination rank, in (token, slot) order within one
    4 experts   each rank puts what it received at (expert, position) of its (E/W, C, D) buffer and
                runs its experts in one batched matmul (``moe.experts_mlp``, the ``grouped`` way,
                whatever ``expert_compute`` says)
    5 combine   the outputs sent back (all_to_all_single, the splits reversed) and each token's
                slots summed in slot order with its gates, as ``grouped`` sums them

The load-balancing loss is the global one on every rank: ``f_e`` from the gathered choices and
``P_e = (sum over every rank's tokens of p_te) / T``, the sum all-reduced with its gradient.

Backward: all_to_all's gradient is the all_to_all of the output gradient with the splits reversed
(``_AllToAll``), all_reduce's the all_reduce of its gradient (``_AllReduce``); both are written here
over ``torch.distributed.all_to_all_single`` and ``all_reduce`` (gloo runs both on CPU tensors).
Each rank differentiates its own loss ``L_r`` (the mean over its B examples plus the global balance
loss), so an expert's gradient arrives as ``sum_r dL_r/dtheta`` and a whole weight's as ``dL_r/dtheta``
on rank r; dividing the first by W and averaging the second gives both the gradient of
``(1/W) sum_r L_r``, what one process of W B examples differentiates. Mathematically the identity;
numerically the router's matmul on T_r rows instead of T, the balance loss's sums split over ranks,
and the gradient's sums over examples split into W partial sums: a reordering of fp32 sums.

Limits: with ``train.accumulate`` k > 1 one forward holds the ranks' i-th micro-batches (W chunks
of B / k examples), not the one-process arm's i-th micro-batch of W B / k, so the capacity drops
other choices; the ``expert-parallel`` row trains without accumulation. The ranks' token counts
must be equal (each rank one slice of one global batch).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from divergence.errors import RecipeError
from divergence.models.moe import Routing, balance_loss, capacity, experts_mlp, moe_layers, queue_positions

EXPERT_WEIGHTS = ("w1", "b1", "w2", "b2")  # the MoE layer's stacked expert weights, experts on dim 0


def shard_experts(denoiser: torch.nn.Module, mesh) -> list[str]:
    """Shard every MoE layer's experts of ``denoiser`` over the 1-D device mesh ``mesh`` (in place:
    rank r keeps experts ``[r E/W, (r+1) E/W)``) and set the layers' forward to :class:`ExpertDispatch`;
    return the layers' names. A RecipeError names the fix when W does not divide the experts."""
    from torch.distributed.tensor import Shard, distribute_tensor

    size, layers = mesh.size(), moe_layers(denoiser)
    for layer in layers.values():
        if layer.config.experts % size:
            raise RecipeError(
                f"train.expert_parallel={size}: {layer.config.experts} experts (model.moe.experts) do not split "
                "evenly over the ranks; choose an expert_parallel that divides model.moe.experts"
            )
        for name in EXPERT_WEIGHTS:
            full = getattr(layer, name)
            shard = distribute_tensor(full.detach(), mesh, [Shard(0)])
            setattr(layer, name, torch.nn.Parameter(shard, requires_grad=full.requires_grad))
        layer.dispatch = ExpertDispatch(mesh.get_group(), size, mesh.get_local_rank())
    return list(layers)


def sharded_experts(denoiser: torch.nn.Module) -> dict[str, int]:
    """``{layer name: ranks its experts are sharded over}`` of ``denoiser``'s MoE layers whose
    experts are DTensors over more than one rank."""
    from torch.distributed.tensor import DTensor

    return {
        name: layer.w1.device_mesh.size()
        for name, layer in moe_layers(denoiser).items()
        if isinstance(layer.w1, DTensor) and layer.w1.device_mesh.size() > 1
    }


class ExpertDispatch:
    """The forward of one MoE layer whose experts are spread over the ``size`` ranks of ``group``
    (this process: ``rank``); see the module docstring for the steps."""

    def __init__(self, group, size: int, rank: int):
        self.group, self.size, self.rank = group, size, rank

    def __call__(self, layer, hidden_states: torch.Tensor) -> torch.Tensor:
        shape, config = hidden_states.shape, layer.config
        tokens = hidden_states.reshape(-1, shape[-1])  # (T_r, D)
        probs = layer.router_probs(tokens)  # (T_r, E)
        k, count = config.top_k, config.experts
        experts = torch.topk(probs.detach(), k, dim=-1).indices  # (T_r, k)
        every = self._gather(experts)  # (T, k): every rank's choices, rank 0's tokens first
        slots = capacity(every.shape[0], k, count, config.capacity_factor)
        position_all = queue_positions(every, count)  # (T, k): one process's queue
        mine = slice(self.rank * tokens.shape[0], (self.rank + 1) * tokens.shape[0])
        kept = position_all[mine] < slots
        gates = probs.gather(1, experts)  # (T_r, k)
        if k > 1:
            gates = gates / gates.sum(-1, keepdim=True)
        gates = gates * kept
        layer.aux_loss = self._balance_loss(probs, every)
        layer.routing = Routing(experts, kept, probs.detach())
        if layer.recorder is not None:
            layer.recorder.append(layer.routing)
        out = self._experts(layer, tokens, experts, kept, every, position_all, slots)
        result = gates[:, 0, None].to(tokens.dtype) * out[:, 0]
        for s in range(1, k):
            result = result + gates[:, s, None].to(tokens.dtype) * out[:, s]
        return result.reshape(shape)

    def _gather(self, experts: torch.Tensor) -> torch.Tensor:
        """Every rank's (T_r, k) choices, concatenated in rank order (the ranks' T_r are equal)."""
        parts = [torch.empty_like(experts) for _ in range(self.size)]
        dist.all_gather(parts, experts.contiguous(), group=self.group)
        return torch.cat(parts)

    def _balance_loss(self, probs: torch.Tensor, every: torch.Tensor) -> torch.Tensor:
        """``E sum_e f_e P_e`` over every rank's tokens: ``moe.balance_loss`` with ``P_e`` the
        all-reduced sum of the probabilities over the global token count."""
        total = _AllReduce.apply(probs.sum(0), self.group)  # (E,): sum over all T tokens
        mean = total / every.shape[0]
        return balance_loss(mean[None], every)

    def _experts(self, layer, tokens, experts, kept, every, position_all, slots):
        """(T_r, k, D): each local choice's expert output (zeros where dropped), computed on the
        expert's rank; ``every``, ``position_all``: the global (T, k) choices and queue places."""
        local = layer.config.experts // self.size  # experts per rank
        owner = experts // local  # (T_r, k): the rank of each choice's expert
        # 3 dispatch: grouped by destination rank, (token, slot) order within one
        sent = [torch.nonzero(kept & (owner == q)) for q in range(self.size)]  # (n_q, 2) of (token, slot)
        order = torch.cat(sent)
        send_sizes = [len(s) for s in sent]
        # what this rank receives: the choices of its experts, sender by sender (rank order = token order)
        mask_all = (position_all < slots) & (every // local == self.rank)  # (T, k)
        received = mask_all.reshape(self.size, -1).sum(-1).tolist()  # per sender rank
        flat = ((every - self.rank * local) * slots + position_all)[mask_all]  # (n,) buffer rows
        inbox = _AllToAll.apply(tokens[order[:, 0]], received, send_sizes, self.group)  # (n, D)
        # 4 experts: an (E/W, C, D) buffer of the received tokens, one batched matmul
        dim = tokens.shape[-1]
        buffer = tokens.new_zeros(local * slots, dim).index_copy(0, flat, inbox)
        weights = [getattr(layer, name).to_local() for name in EXPERT_WEIGHTS]
        done = experts_mlp(buffer.reshape(local, slots, dim), *weights).reshape(local * slots, dim)
        # 5 combine: the outputs back to their tokens' ranks, in the order they came
        back = _AllToAll.apply(done[flat], send_sizes, received, self.group)  # (n_sent, D)
        rows = order[:, 0] * experts.shape[1] + order[:, 1]
        out = tokens.new_zeros(experts.numel(), dim).index_copy(0, rows, back)
        return out.reshape(*experts.shape, dim)


class _AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` with its gradient: rows split by ``send`` sizes out, ``receive``
    sizes in; the backward sends the output's gradient back with the splits reversed."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, receive: list[int], send: list[int], group) -> torch.Tensor:
        ctx.receive, ctx.send, ctx.group = receive, send, group
        out = rows.new_empty(sum(receive), *rows.shape[1:])
        dist.all_to_all_single(out, rows.contiguous(), receive, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        back = grad.new_empty(sum(ctx.send), *grad.shape[1:])
        dist.all_to_all_single(back, grad.contiguous(), ctx.send, ctx.receive, group=ctx.group)
        return back, None, None, None


class _AllReduce(torch.autograd.Function):
    """The sum over the ranks of ``group`` with its gradient (the sum of the ranks' gradients)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        out = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=ctx.group)
        return out, None
