"""The router's own record: how often two routings of the same tokens choose other experts.

In a mixture of experts a token goes to the k experts its router scores highest. Two arms that
compute the router logits in a different order of sums (or precision) agree on almost every
token, but where a token's k-th and (k+1)-th logits are closer than the arms' difference the
choice flips: that token then computes another function in each arm, a discrete jump no
weight-space norm sees coming (docs/method.md). For routings of the same T tokens with k slots,
chosen experts ``S_t^a`` and ``S_t^b`` (sets of k)::

    flips       = sum_t (k - |S_t^a  intersect  S_t^b|)
    flip_frac   = flips / (T k)                    in [0, 1]; 0 for identical routers

A choice counts as flipped when its expert is not among the other routing's k for that token; a
swap of order inside the k (the same experts, other gates) is no flip: the token is sent to the
same experts. Capacity drops (a choice past its expert's capacity, which then adds nothing)::

    drop_frac   = #(dropped choices) / (T k)

Pure functions of tensors (no model, no files): the probe feeds them routings recorded on its
fixed inputs (``divergence.training.probe``); a user can feed them any two routings.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def router_flips(experts_a: torch.Tensor, experts_b: torch.Tensor) -> int:
    """Flipped (token, slot) choices between two routings ``(T, k)`` of expert indices.

    >>> router_flips(torch.tensor([[0, 1], [2, 3]]), torch.tensor([[1, 0], [2, 1]]))
    1
    """
    if experts_a.shape != experts_b.shape or experts_a.dim() != 2:
        raise ValueError(
            f"routings must both be (tokens, k); got {tuple(experts_a.shape)} and {tuple(experts_b.shape)}"
        )
    shared = (experts_a[:, :, None] == experts_b[:, None, :]).any(-1)  # (T, k): a's choice also chosen by b
    return int(experts_a.numel() - shared.sum())


def flip_fraction(experts_a: torch.Tensor, experts_b: torch.Tensor) -> float:
    """``router_flips / (T k)``; NaN for an empty routing.

    >>> flip_fraction(torch.tensor([[0, 1], [2, 3]]), torch.tensor([[1, 0], [2, 1]]))
    0.25
    """
    return router_flips(experts_a, experts_b) / experts_a.numel() if experts_a.numel() else float("nan")


def layer_flip_fractions(
    routes_a: Mapping[str, torch.Tensor], routes_b: Mapping[str, torch.Tensor]
) -> tuple[float, dict[str, float]]:
    """``(overall, {layer: fraction})`` of two routings per layer (``{layer: (T, k)}``); overall
    counts every layer's choices together (layers weighted by their choices).

    >>> a = {"l0": torch.tensor([[0, 1]]), "l1": torch.tensor([[0, 1]])}
    >>> layer_flip_fractions(a, {"l0": torch.tensor([[0, 2]]), "l1": torch.tensor([[1, 0]])})
    (0.25, {'l0': 0.5, 'l1': 0.0})
    """
    if set(routes_a) != set(routes_b):
        raise ValueError(f"the routings name other layers: {sorted(set(routes_a) ^ set(routes_b))}")
    flips = {name: router_flips(routes_a[name], routes_b[name]) for name in routes_a}
    choices = {name: routes_a[name].numel() for name in routes_a}
    total = sum(choices.values())
    per_layer = {name: flips[name] / choices[name] if choices[name] else float("nan") for name in routes_a}
    return (sum(flips.values()) / total if total else float("nan")), per_layer


def drop_fraction(kept: torch.Tensor | Mapping[str, torch.Tensor]) -> float:
    """Fraction of (token, slot) choices the capacity limit dropped: ``kept`` (T, k) bool, or one
    per layer (``{layer: (T, k)}``, counted together); NaN when there are none.

    >>> drop_fraction(torch.tensor([[True, False], [True, True]]))
    0.25
    """
    masks = list(kept.values()) if isinstance(kept, Mapping) else [kept]
    total = sum(m.numel() for m in masks)
    return sum(int((~m.bool()).sum()) for m in masks) / total if total else float("nan")
