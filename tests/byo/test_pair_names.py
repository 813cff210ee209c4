"""Pairs written through ``ArmWriter`` keep the names their writers were given, in every verdict.

Each pair's arms are weights drawn to a known relative difference E(t) (arm a = arm b + E(t)
||theta_b|| u, u a unit direction), so the dose ratio is known: the study pair's E is 1e-3 of
the precision pair's at every step, log10 ratio -3. The writers, ``watch`` and ``report`` are
the real ones.
"""

import dataclasses
import json
import zlib

import torch

from divergence.analysis import analyze
from divergence.cli import main
from divergence.comparator.follow import Comparator
from divergence.report.content import pairs_table
from divergence.report.inputs import load_pairs
from divergence.writers import ArmWriter

STEPS = 30
SHAPES = {"blocks.0.attn.c_attn.weight": (24, 8), "blocks.0.mlp.c_fc.weight": (32, 8), "head.weight": (4, 8)}
# name, category, E(1) (None: the seed pair, different inits, at the seed level from step 0)
PAIRS = (
    ("flash-vs-baseline", "optimization", 1e-6),
    ("bf16-vs-fp32", "precision", 1e-3),
    ("seed-vs-seed", "seed", None),
)


def arm_weights(name: str, eps, replicate: int, step: int) -> tuple[dict, dict]:
    """(arm a, arm b) weights of one pair at ``step``: E(t) = eps exp(t / 20), the seed pair ~1."""
    g = torch.Generator().manual_seed(1000 * replicate + step)  # the training path: shared by the pairs
    b = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) % 1000 + 7 * replicate)  # the pair's direction
    u = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    norm_b = torch.sqrt(sum(v.pow(2).sum() for v in b.values()))
    norm_u = torch.sqrt(sum(v.pow(2).sum() for v in u.values()))
    e = 1.0 if eps is None else (0.0 if step == 0 else eps * torch.e ** (step / 20))
    return {k: b[k] + e * norm_b / norm_u * u[k] for k in b}, b


def write_pair(folder, name, category, eps, replicate, **given):
    for arm in ("a", "b"):
        writer = ArmWriter(folder, arm, max_steps=STEPS, name=name, category=category, replicate=replicate, **given)
        for step in range(STEPS + 1):
            weights = arm_weights(name, eps, replicate, step)[0 if arm == "a" else 1]
            writer.record(step, weights, None if step == 0 else 1.0 / (1 + step))
        writer.finish()
    assert Comparator(folder, log=False, progress=False).run(poll=0.01, timeout=30) == 0


def study(root, replicates=2):
    for r in range(replicates):
        for name, category, eps in PAIRS:
            write_pair(root / f"{name}-r{r}", name, category, eps, r)
    return root


def analysis(root):
    """What ``divergence report ROOT`` concludes (its reader and analysis; the figures left out)."""
    return analyze(load_pairs([root]), n_boot=100)


def verdicts(root):
    return [dataclasses.asdict(v) for v in analysis(root).verdicts]


def test_the_verdict_calls_armwriter_pairs_by_their_names(tmp_path):
    (verdict,) = verdicts(study(tmp_path / "study"))
    assert verdict["study"] == "flash-vs-baseline"
    assert verdict["headline"].startswith("Bounded: flash-vs-baseline perturbs training 1000x less than bf16-vs-fp32 ")
    assert "a vs b" not in verdict["headline"]


def test_pair_set_renames_and_relabels_the_arms(tmp_path, capsys):
    root = study(tmp_path / "study")
    for folder in root.glob("flash-vs-baseline-r*"):
        assert main(["pair", str(folder), "name=my-kernel", "arms.a=attention=mine", "arms.b=attention=sdpa"]) == 0
    result = analysis(root)
    (verdict,) = result.verdicts
    assert verdict.study == "my-kernel" and verdict.headline.startswith("Bounded: my-kernel perturbs training")
    pair = json.loads((root / "flash-vs-baseline-r0" / "pair.json").read_text())
    assert pair["description"] == "attention=mine vs attention=sdpa"  # the arms' labels follow, as written
    rows = {row[:4] for row in pairs_table(result).rows}  # the report's pairs table
    assert ("my-kernel", "0", "under study", "attention=mine vs attention=sdpa") in rows
    # a description a person gives is the name's longer form: the verdict reads it
    for folder in root.glob("flash-vs-baseline-r*"):
        assert main(["pair", str(folder), "description=my kernel vs sdpa"]) == 0
    (verdict,) = verdicts(root)
    assert verdict["study"] == "my-kernel" and verdict["headline"].startswith("Bounded: my kernel vs sdpa perturbs")
