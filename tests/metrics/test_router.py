"""The router's record: identical routers flip nothing, a known logit perturbation flips exactly the
tokens whose margin it crosses (so the count grows with it), capacity drops are counted."""

import pytest
import torch

from divergence.metrics.router import drop_fraction, flip_fraction, layer_flip_fractions, router_flips
from divergence.models.moe import MoEFeedForward, route
from divergence.recipe.model import MoEConfig


def _logits(tokens=200, experts=4, seed=0):
    return torch.randn(tokens, experts, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_identical_routers_flip_nothing():
    logits = _logits()
    experts, _, _ = route(torch.softmax(logits, -1), 2, 400)
    assert router_flips(experts, experts.clone()) == 0 and flip_fraction(experts, experts) == 0.0
    # the same experts in another order inside the k: the token goes to the same experts
    assert flip_fraction(experts, experts.flip(-1)) == 0.0


def test_a_known_perturbation_flips_exactly_the_tokens_whose_margin_it_crosses():
    # Raise each token's third-ranked logit by eps: its top-2 changes iff eps exceeds the margin
    # m_t = logit_(2) - logit_(3), and then exactly one of its 2 choices flips. So the flip count
    # is #{t : m_t < eps}: known exactly, and non-decreasing in eps.
    logits, k = _logits(), 2
    ranked = torch.sort(logits, -1, descending=True)
    margin = ranked.values[:, 1] - ranked.values[:, 2]
    before, _, _ = route(torch.softmax(logits, -1), k, 400)
    counts = []
    for eps in (0.0, 1e-3, 1e-2, 0.1, 0.3, 1.0):
        perturbed = logits.clone()
        perturbed.scatter_add_(1, ranked.indices[:, 2:3], torch.full((200, 1), eps, dtype=torch.float64))
        after, _, _ = route(torch.softmax(perturbed, -1), k, 400)
        counts.append(router_flips(before, after))
        assert counts[-1] == int((margin < eps).sum()), eps
        assert flip_fraction(before, after) == counts[-1] / (200 * k)
    assert counts[0] == 0 and counts[-1] > counts[2] > 0
    assert counts == sorted(counts)


def test_per_layer_fractions_and_overall_weighted_by_choices():
    a = {"l0": torch.tensor([[0, 1], [1, 2]]), "l1": torch.tensor([[3, 0]])}
    b = {"l0": torch.tensor([[0, 3], [2, 1]]), "l1": torch.tensor([[2, 1]])}
    overall, per_layer = layer_flip_fractions(a, b)
    assert per_layer == {"l0": 0.25, "l1": 1.0} and overall == pytest.approx(3 / 6)
    with pytest.raises(ValueError, match="other layers"):
        layer_flip_fractions(a, {"l0": b["l0"]})
    with pytest.raises(ValueError, match="tokens, k"):
        router_flips(a["l0"], a["l1"])


def test_capacity_drops_are_counted_on_a_constructed_batch():
    # 8 tokens of width 2, 4 experts, top-1, capacity factor 1: 2 slots per expert. The router
    # sends every token to expert 0 (its weight row 0 dominates): 2 kept, 6 dropped.
    layer = MoEFeedForward(2, 3, MoEConfig(experts=4, top_k=1, capacity_factor=1.0))
    with torch.no_grad():
        layer.router.weight.copy_(torch.tensor([[10.0, 10.0], [0, 0], [0, 0], [0, 0]]))
        out = layer(torch.ones(1, 8, 2))
    assert layer.routing.experts.flatten().tolist() == [0] * 8
    assert drop_fraction(layer.routing.kept) == 6 / 8
    assert torch.count_nonzero(out.abs().sum(-1)) == 2  # dropped tokens get nothing from the experts
    assert drop_fraction({"l0": layer.routing.kept, "l1": torch.ones(8, 1, dtype=torch.bool)}) == 6 / 16
