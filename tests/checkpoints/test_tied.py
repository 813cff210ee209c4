"""Tied parameters (one tensor under two names, GPT-2's ``wte`` / ``lm_head``) are counted once."""

import json

import torch

from divergence.checkpoints.compare import compare_state_dicts
from divergence.cli import main
from divergence.comparator.follow import Comparator
from divergence.writers import ArmWriter


class TiedLM(torch.nn.Module):
    """A nanoGPT-like model whose output layer is its token embedding (``lm_head.weight = wte.weight``)."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.wte = torch.nn.Embedding(32, 8)
        self.attn = torch.nn.ModuleDict({"c_attn": torch.nn.Linear(8, 24), "c_proj": torch.nn.Linear(8, 8)})
        self.lm_head = torch.nn.Linear(8, 32, bias=False)
        self.lm_head.weight = self.wte.weight


def parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())  # a shared parameter once


def test_a_tied_tensor_counts_once_and_is_named(tmp_path):
    a, b = TiedLM(0), TiedLM(1)
    result = compare_state_dicts(a.state_dict(), b.state_dict())
    assert result.summary["numel"] == parameters(a) == 32 * 8 + 8 * 24 + 24 + 8 * 8 + 8
    (wte,) = [r for r in result.records if r["name"] == "wte.weight"]
    assert wte["tied"] == ["lm_head.weight"] and "lm_head.weight" not in {r["name"] for r in result.records}
    # tied on one side only, lm_head is a tensor of its own on the other: both names compared
    untied = {k: v.clone() for k, v in b.state_dict().items()}
    assert compare_state_dicts(a.state_dict(), untied).summary["numel"] == parameters(a) + 32 * 8


def test_pickles_keep_the_tie_and_compare_names_it(tmp_path, capsys):
    for name, seed in (("a.pt", 0), ("b.pt", 1)):
        torch.save(TiedLM(seed).state_dict(), tmp_path / name)  # torch.save keeps the shared storage
    assert main(["compare", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--top", "0"]) == 0
    out = capsys.readouterr().out
    assert "wte.weight (tied: lm_head.weight)" in out and f"{parameters(TiedLM(0)):,} values compared" in out
    assert "tied (one tensor, counted once): wte.weight = lm_head.weight" in out


def test_armwriter_saves_a_tied_tensor_once_and_watch_stores_the_tie(tmp_path):
    for arm, seed in (("a", 0), ("b", 1)):
        model = TiedLM(seed)
        writer = ArmWriter(tmp_path, arm, max_steps=1, name="tied")
        writer.record(0, model)
        writer.record(1, model, 1.0)
        writer.finish()
    assert Comparator(tmp_path, log=False, progress=False).run(poll=0.01, timeout=30) == 0
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in lines if r["type"] == "step" and r["step"] == 1][0]
    tensors = {r["tensor"]: r for r in lines if r["type"] == "tensor" and r["step"] == 1}
    assert step["numel"] == parameters(TiedLM(0)) and "lm_head.weight" not in tensors
    assert tensors["wte.weight"]["tied"] == ["lm_head.weight"]
    assert tensors["attn.c_proj.weight"]["kind"] == "attn_out" and tensors["attn.c_attn.weight"]["kind"] == "attn_qkv"
