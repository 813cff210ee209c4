"""The bug zoo: bugs from public history and legitimate reorderings, each a short paired run on a tiny GPT-2
or on divergence's built-in UNet, read by divergence's two checks and by the rules the big trainers use, on
the same runs.

    nice -n 10 python benchmarks/bug_zoo.py --out zoo            # every case (benchmarks/zoo_cases.py)
    python benchmarks/bug_zoo.py --out zoo --only unreduced-param data-parallel-2 --steps 8

A case names its backbone (``BACKBONES``): the tiny GPT-2 of ``zoo_cases`` or the tiny recipe's UNet and
text encoder of ``zoo_unet``; each backbone module gives its model, batches, baseline path, training loop
and one-step arguments. For every case: the change's arm and the baseline's arm are trained ``--steps``
optimizer steps from the same weights on the same batches and written through ``divergence.ArmWriter``
into ``OUT/<case>/`` (arm a the change, arm b the baseline; every step tracked), beside the backbone's
reordering pair (arm a the baseline over 2 micro-batches summed last to first): ``OUT/reference/`` for
the GPT-2, ``OUT/reference-unet/`` for the UNet. Then:

- the one-step check (``divergence.one_step_check``) on the initial weights and step 1's batch, against
  the baseline over 2, 4 and 8 micro-batches (an update, for the optimizer case, from AdamW's state after 3
  baseline steps);
- the trajectory check (``divergence.trajectory_check``) of ``OUT/<case>`` against ``OUT/reference``;
- divergence's answer: beyond reordering when the one-step check says so (decided at step 1), else the
  trajectory's status and the step it was decided by;
- the anchors' rules on the two arms' losses (``divergence.analysis.anchors``); Megatron's band from
  three runs of the baseline that differ only in the order of their sums (the baseline, and its loop over
  2 and over 8 micro-batches summed last to first): on a CPU the baseline repeated is bitwise itself.

FSDP vs DDP and ZeRO-1 vs DDP are real 2-rank gloo runs (``zoo_distributed``, one spawn of 2 CPU processes
before the others): arm b is DDP's run, the one-step check runs on both ranks, and DDP's losses take the
one-process baseline's place among the band's repeats. The ``torch.compile`` case compiles with inductor
(a C++ compiler on the CPU) into ``OUT/inductor-cache`` (``TORCHINDUCTOR_CACHE_DIR`` while the cases run).

Writes ``OUT/zoo.json`` and ``OUT/zoo.md`` (the table, the misses and false alarms per rule, the time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import zoo_cases  # noqa: E402
import zoo_distributed  # noqa: E402
import zoo_unet  # noqa: E402
from zoo_cases import Arm  # noqa: E402

from divergence import ArmWriter  # noqa: E402
from divergence.analysis.anchors import RULES, all_rules  # noqa: E402
from divergence.analysis.one_step import one_step_check  # noqa: E402
from divergence.analysis.trajectory_check import trajectory_check  # noqa: E402

REPEATS = {"reordered-2": 2, "reordered-8": 8}  # the baseline's loop over k micro-batches, last first
BACKBONES = {"gpt2": zoo_cases, zoo_unet.NAME: zoo_unet}  # a case's ``backbone``: the module that trains it
CASES = [*zoo_cases.CASES, *zoo_unet.CASES]


def reference_folder(backbone: str) -> str:
    """The backbone's reordering pair's folder under OUT: ``reference`` (GPT-2), ``reference-<name>``."""
    return "reference" if backbone == "gpt2" else f"reference-{backbone}"


def record(arm: Arm, steps: int, backbone=zoo_cases) -> dict:
    """A run kept in memory: ``{"weights": {step: state}, "losses": {step: loss}}``."""
    run = {"weights": {}, "losses": {}}

    def keep(step, model, loss):
        run["weights"][step] = {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}
        if loss is not None:
            run["losses"][step] = loss

    backbone.train(arm, steps, keep)
    return run


def write_arm(out: Path, arm: str, run: dict, steps: int, **pair) -> None:
    with ArmWriter(out, arm, max_steps=steps, every=1, **pair) as writer:
        for step in range(steps + 1):
            writer.record(step, run["weights"][step], run["losses"].get(step))


def write_pair(out: Path, change: dict, base: dict, steps: int, **pair) -> None:
    write_arm(out, "a", change, steps, **pair)
    write_arm(out, "b", base, steps, **pair)


def baselines(out: Path, backbone: str, steps: int) -> tuple[dict, list[dict]]:
    """The backbone's baseline run and the band's repeats (the baseline and its reordered loops), its
    reordering pair written to ``OUT/<reference_folder>``."""
    module = BACKBONES[backbone]
    base = record(Arm(grad=module.baseline), steps, module)
    refs = {
        name: record(Arm(grad=partial(module.baseline, micro=k, reverse=True)), steps, module)
        for name, k in REPEATS.items()
    }
    folder = reference_folder(backbone)
    write_pair(out / folder, refs["reordered-2"], base, steps, name=folder, category="reordering")
    return base, [base["losses"]] + [r["losses"] for r in refs.values()]


def run_case(case, out: Path, base: dict, repeats: list[dict], steps: int, ranked: dict) -> dict:
    """One case's row. A case on real ranks was trained and checked in ``ranked`` (``zoo_distributed.run``):
    its baseline is DDP's run, which takes the one-process baseline's place in the band's repeats."""
    start, module = time.perf_counter(), BACKBONES[case.backbone]
    if case.ranks:
        done = ranked[case.name]
        change, base, one = {"losses": done["change"]}, {"losses": done["base"]}, done["one_step"]
        repeats = [base["losses"], *repeats[1:]]
    else:
        change = record(case.arm, steps, module)
        write_pair(out / case.name, change, base, steps, name=case.name, category="optimization", expect_identity=True)
        one = one_step_check(**module.one_step_args(case)).to_dict()
    traj = trajectory_check(out / case.name, out / reference_folder(case.backbone))
    if one["status"] == "beyond_reordering":
        status, decided = one["status"], 1
    else:
        status, decided = traj["status"], traj["decided_step"]
    rules = all_rules(change["losses"], base["losses"], repeats)
    return {
        "case": case.name,
        "backbone": case.backbone,
        "truth": "bug" if case.bug else "legitimate",
        "source": case.source,
        "one_step": {k: one[k] for k in ("status", "log10_ratio", "lo", "hi", "seconds")},
        "trajectory": {k: traj[k] for k in ("status", "log10_ratio", "lo", "hi", "decided_step", "steps")},
        "status": status,
        "decided_step": decided,
        "rules": rules,
        "seconds": time.perf_counter() - start + (ranked[case.name]["seconds"] if case.ranks else 0.0),
    }


def run_zoo(out: str | Path, names: list[str] | None = None, steps: int = 30, ranked: dict | None = None) -> dict:
    """Train and read every case (or ``names``); returns what ``zoo.json`` holds. ``ranked``: the cases on
    real ranks already trained into ``out`` by ``zoo_distributed.run_on_rank`` (``zoo_distributed.load``),
    so that a test session's one gloo spawn serves them; None: spawned here."""
    out, start = Path(out), time.perf_counter()
    cases = [c for c in CASES if names is None or c.name in names]
    unknown = sorted(set(names or []) - {c.name for c in CASES})
    if unknown:
        raise SystemExit(f"bug_zoo: unknown case {unknown[0]!r}; cases: {', '.join(c.name for c in CASES)}")
    if ranked is None:
        ranked = (
            zoo_distributed.run(out, [c.name for c in cases if c.ranks], steps) if any(c.ranks for c in cases) else {}
        )
    runs = {}
    for name in dict.fromkeys(c.backbone for c in cases):
        with threads(BACKBONES[name]):
            runs[name] = baselines(out, name, steps)
    rows = []
    with inductor_cache(out / "inductor-cache" if any(c.arm.compile for c in cases) else None):
        for case in cases:
            with threads(BACKBONES[case.backbone]):
                rows.append(run_case(case, out, *runs[case.backbone], steps, ranked))
    result = {"steps": steps, "rows": rows, "counts": counts(rows), "seconds": time.perf_counter() - start}
    (out / "zoo.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "zoo.md").write_text(markdown(result))
    return result


@contextmanager
def threads(backbone):
    """torch's intra-op threads set to the backbone's ``THREADS`` while it trains, then put back; a backbone
    without one runs with torch's default. (The UNet's recipe says 1: its CPU numbers depend on the count,
    and 2 threads on 2 shared cores run its convolutions ten times slower.)"""
    before, count = torch.get_num_threads(), getattr(backbone, "THREADS", None)
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def inductor_cache(folder: Path | None):
    """``TORCHINDUCTOR_CACHE_DIR`` set to ``folder`` (the zoo's own: a run compiles from scratch and leaves no
    cache elsewhere) while the cases run, then put back; None: left as it is."""
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if folder is not None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder.resolve())
    try:
        yield
    finally:
        if folder is not None and before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        elif folder is not None:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def counts(rows: list[dict]) -> dict:
    """Misses (a bug called "the same") and false alarms (a legitimate change flagged), per rule and ours."""
    out = {}
    for rule in ("divergence", *RULES):
        same = [r["status"] == "reordering_like" if rule == "divergence" else r["rules"][rule] for r in rows]
        flagged = [r["status"] == "beyond_reordering" if rule == "divergence" else not r["rules"][rule] for r in rows]
        out[rule] = {
            "misses": sum(s for s, r in zip(same, rows) if r["truth"] == "bug"),
            "false_alarms": sum(f for f, r in zip(flagged, rows) if r["truth"] != "bug"),
            "undecided": sum(not s and not f for s, f in zip(same, flagged)),
        }
    return out


def _ratio(read: dict, interval: str) -> str:
    if read["log10_ratio"] is None or read["log10_ratio"] == -float("inf"):
        return "bitwise equal"
    if read["lo"] is None:
        return f"{read['log10_ratio']:+.2f}"
    return f"{read['log10_ratio']:+.2f} {interval} {read['lo']:+.2f} to {read['hi']:+.2f}"


MODELS = {"gpt2": "GPT-2", "unet": "UNet"}  # a backbone's name in the table


def markdown(result: dict) -> str:
    head = (
        "| case | model | truth | one step: log10 E_X/E_R (95% CI) | trajectory: median log10 E_X/E_R (range) | divergence "
        "| decided by step | titan assert-equal | titan step-1 rtol 1e-5 | Megatron golden rtol 0.05 | Megatron band |"
    )
    lines = [head, "|" + " --- |" * 11]
    word = {"reordering_like": "reordering-like", "beyond_reordering": "**beyond reordering**", None: "no reading"}
    for r in result["rows"]:
        rules = " | ".join("same" if r["rules"][k] else "**differs**" for k in RULES)
        lines.append(
            f"| {r['case']} | {MODELS[r['backbone']]} | {r['truth']} | {_ratio(r['one_step'], 'CI')} | {_ratio(r['trajectory'], 'range')} | "
            f"{word.get(r['status'], r['status'])} | {r['decided_step']} | {rules} |"
        )
    lines += ["", "| rule | misses (bugs called the same) | false alarms (legitimate changes flagged) | undecided |"]
    lines.append("| --- | --- | --- | --- |")
    lines += [f"| {k} | {v['misses']} | {v['false_alarms']} | {v['undecided']} |" for k, v in result["counts"].items()]
    lines += ["", "Sources:", ""] + [f"- {r['case']}: {r['source']}" for r in result["rows"]]
    lines += ["", f"{len(result['rows'])} cases, {result['steps']} steps each: {result['seconds']:.0f} s wall."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="a new folder: the pair folders, zoo.json and zoo.md")
    parser.add_argument("--only", nargs="+", metavar="CASE", help="these cases only")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per run (default 30)")
    args = parser.parse_args(argv)
    if Path(args.out).exists():
        raise SystemExit(f"bug_zoo: {args.out} exists; give a new folder")
    result = run_zoo(args.out, args.only, args.steps)
    print((Path(args.out) / "zoo.md").read_text())
    return 0 if result else 1


if __name__ == "__main__":
    zoo_cases.make_model()  # transformers imported before the clock of the first case
    sys.exit(main())
