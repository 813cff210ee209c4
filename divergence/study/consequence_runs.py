"""Phase 2 of ``divergence consequence``: every trained pair run read, and each arm's samples scored once.

An arm's sample score (``training.sample_score``: its weights at the pair run's last step, sampled
for the recipe's captions and seeds, checked by the shapes checker) is written to
``<pair run>/<arm>/score.json`` with the step and the score settings it was read with. An arm
several pair runs share (``study.shared_arms``: a borrowed arm is a link to its owner's folder) is
therefore scored once, and a command run again reads the score back instead of sampling; a file
written with other settings, or at another step, is scored again. The file is written atomically,
so a run killed while scoring leaves whole scores only. Beside it, ``<arm>/samples.safetensors``
holds the images of the first sampling seed (what the report's sample grids show); an arm scored
before it existed, or whose file is lost, draws that seed again (each image from its own noise: the
same images the score read).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import torch

from divergence.analysis import outcome
from divergence.analysis.consequence import early_doses
from divergence.metrics.sample_distance import sample_distance
from divergence.metrics.score_intervals import paired_seed_bootstrap
from divergence.study.calibration import LADDER_ROLE, REFERENCE_ROLES, ladder_name
from divergence.study.consequence import SCORED, Consequence, ScoreSettings

SCORE_FILE = "score.json"
SAMPLES_FILE = "samples.safetensors"
EARLIER_SCORES = "scores"  # <arm>/scores/step_NNNNNN.json: the seed pair's arms at their earlier weights files
PLATEAU_SEEDS = 2  # sampling seeds the earlier weights files are scored with (the last one's first two)


def arm_score(
    run: Path, arm: str, step: int, settings: ScoreSettings, device: str = "cpu", final: bool = True
) -> tuple[dict, bool]:
    """``(score.json's record, whether it was scored now)`` for arm ``arm`` of pair run ``run`` at
    ``step``; not ``final``: an earlier weights file, scored into ``<arm>/scores/step_NNNNNN.json``
    (no samples kept)."""
    from divergence.tables import write_json
    from divergence.training.sample_score import score_samples

    path, wanted = _score_file(run, arm, step, final), {"step": step, "settings": settings.as_dict()}
    record = _read(path)
    if _holds(record, wanted):
        return record, False
    images = _draw(run, arm, step, settings, settings.seeds, device)
    scored = score_samples(images, list(settings.captions))
    hits = {name: table.to(torch.uint8).tolist() for name, table in scored["hits"].items()}
    record = {**wanted, "rates": scored["rates"], "hits": hits}
    if final:
        _write_samples(path.parent / SAMPLES_FILE, images[0], wanted)
    else:
        path.parent.mkdir(exist_ok=True)
    write_json(path, record)
    return record, True


def _score_file(run: Path, arm: str, step: int, final: bool) -> Path:
    return Path(run) / arm / (SCORE_FILE if final else f"{EARLIER_SCORES}/step_{step:06d}.json")


def _holds(record: dict | None, wanted: dict) -> bool:
    """Whether a score record was read at ``wanted``'s step with its settings, whole."""
    return record is not None and all(record.get(k) == v for k, v in wanted.items()) and _whole(record)


def score_tasks(jobs: list, consequence: Consequence) -> list[tuple]:
    """The scores phase 2 reads that no score file holds yet, each ``(run, arm, step, settings, final)``
    as ``arm_score`` takes them: every arm at its pair run's last step, and the seed pair's arms at
    their earlier weights files (``seed_pair_series``); a file of an arm several pair runs share once."""
    from divergence.report.inputs import load_pair

    tasks, seen = [], set()
    for job in jobs:
        for arm in ("a", "b"):
            wanted = [(job.max_steps, consequence.score, True)]
            if job.pair.role == "seed":
                every = _checkpoint_every(load_pair(job.out).recipe)
                wanted += [task for task in _plateau(job, arm, every, consequence.score) if not task[2]]
            for step, settings, final in wanted:
                file = _score_file(job.out, arm, step, final)
                if (where := file.resolve()) in seen:
                    continue
                seen.add(where)
                if not _holds(_read(file), {"step": step, "settings": settings.as_dict()}):
                    tasks.append((job.out, arm, step, settings, final))
    return tasks


def score_all(tasks: list[tuple], workers: int, device: str = "cpu", progress=print) -> None:
    """Score ``tasks`` (``score_tasks``) in ``workers`` processes of one thread each (sampling is
    CPU-bound Python and torch: one process per core); each writes its own score file atomically, so
    an interrupted phase keeps what was scored. ``progress`` gets a line per score."""
    import time

    started = time.monotonic()

    def report(i: int, task: tuple) -> None:
        run, arm, step = task[:3]
        progress(
            f"scored {i}/{len(tasks)}: {run.parent.name}/{run.name}/{arm} at step {step} ({time.monotonic() - started:.0f} s)"
        )

    if workers <= 1 or len(tasks) <= 1:
        for i, task in enumerate(tasks, 1):
            _score(task, device)
            report(i, task)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    context = multiprocessing.get_context("spawn")  # the parent's torch thread pool is not forked
    with ProcessPoolExecutor(
        min(workers, len(tasks)), mp_context=context, initializer=torch.set_num_threads, initargs=(1,)
    ) as pool:
        futures = {pool.submit(_score, task, device): task for task in tasks}
        try:
            for i, done in enumerate(as_completed(futures), 1):
                done.result()
                report(i, futures[done])
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _score(task: tuple, device: str) -> None:
    run, arm, step, settings, final = task
    arm_score(run, arm, step, settings, device, final)


def _plateau(job, arm: str, every: int, settings: ScoreSettings) -> list[tuple[int, ScoreSettings, bool]]:
    """``(step, settings, final)`` of each score the seed pair's plateau reads of ``arm``: its weights
    files of the ``every`` cadence with the first ``PLATEAU_SEEDS`` sampling seeds, the last step's
    with every seed (its ``score.json``)."""
    from dataclasses import replace

    from divergence.pairfolder.folder import weight_steps

    early = replace(settings, seeds=settings.seeds[:PLATEAU_SEEDS])
    steps = (s for s in weight_steps(job.out / arm) if s % every == 0 or s == job.max_steps)
    return [(s, settings, True) if s == job.max_steps else (s, early, False) for s in steps]


def _checkpoint_every(recipe: dict | None) -> int:
    """A pair run's ``train.checkpoint_every`` (the cadence of its weights files the plateau reads)."""
    return max(1, int(((recipe or {}).get("train") or {}).get("checkpoint_every") or 1))


def arm_samples(run: Path, arm: str, step: int, settings: ScoreSettings, device: str = "cpu") -> torch.Tensor:
    """(N, H, W, 3) uint8: the arm's images of the score's captions from its first sampling seed,
    read from ``samples.safetensors`` or, where it is missing or of other settings, drawn again."""
    path = Path(run) / arm / SAMPLES_FILE
    wanted = {"step": step, "settings": settings.as_dict()}
    images = _read_samples(path, wanted)
    if images is None:
        images = _draw(run, arm, step, settings, settings.seeds[:1], device)[0]
        _write_samples(path, images, wanted)
    return images


def _draw(run: Path, arm: str, step: int, settings: ScoreSettings, seeds, device: str) -> torch.Tensor:
    """(S, N, H, W, 3) uint8: the arm's images of the score's captions, one stack per sampling seed."""
    from divergence.training.sample_score import draw, load_trained

    return draw(
        load_trained(run, arm, step, device),
        list(settings.captions),
        list(seeds),
        steps=settings.steps,
        sampler=settings.sampler,
        guidance_scale=settings.guidance_scale,
        batch_size=settings.batch_size,
    )


def _write_samples(path: Path, images: torch.Tensor, wanted: dict) -> None:
    from safetensors.torch import save_file

    from divergence.atomic import atomic_target

    with atomic_target(path) as tmp:
        save_file({"images": images.contiguous()}, str(tmp), metadata={"read_with": json.dumps(wanted)})


def _read_samples(path: Path, wanted: dict) -> torch.Tensor | None:
    """The images of ``path`` when it was written with ``wanted`` (step and settings), else None."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            if json.loads((f.metadata() or {}).get("read_with", "null")) != json.loads(json.dumps(wanted)):
                return None
            return f.get_tensor("images")
    except (OSError, ValueError, SafetensorError):  # missing, torn or not ours: drawn again
        return None


def read_runs(jobs: list, consequence: Consequence, device: str = "cpu") -> tuple[list[dict], dict]:
    """``(rows, counts)``: one row per pair run (``docs/consequence-json.md``), every arm scored
    (``counts``: arms ``scored`` now and ``reused`` from their ``score.json``) and both arms' kept
    images compared (``metrics.sample_distance``)."""
    from divergence.report.inputs import load_pair

    by_pair = defaultdict(list)
    for job in jobs:
        by_pair[job.pair.name].append((job, load_pair(job.out)))
    of_role = defaultdict(list)
    for items in by_pair.values():
        of_role[items[0][0].pair.role] += [data for _, data in items]
    where = outcome.source([data for items in by_pair.values() for _, data in items])
    eps_of = {ladder_name(eps): eps for eps in consequence.doses}
    what = consequence.score.attribute
    counts = {"scored": 0, "reused": 0}
    rows = []
    for name, items in by_pair.items():
        role = items[0][0].pair.role
        runs = [data for _, data in items]
        early = _early(role, runs, of_role, consequence.early)
        probe = {p.replicate: outcome.delta(p, where) for p in runs}
        for job, data in items:
            scores = {}
            for arm in ("a", "b"):
                scores[arm], now = arm_score(job.out, arm, job.max_steps, consequence.score, device)
                counts["scored" if now else "reused"] += 1
            images = [arm_samples(job.out, arm, job.max_steps, consequence.score, device) for arm in ("a", "b")]
            row = _row(name, role, eps_of.get(name), job, early.get(data.replicate, {}), scores, probe, where, what)
            rows.append({**row, "sample_distance": sample_distance(*images)})
    return rows, counts


def _early(role: str, runs: list, of_role: dict, window: tuple[int, int]) -> dict:
    """The early dose of one pair's runs: the precision pair at 0 dex by definition, none for the seed pair."""
    if role == "precision":
        return {p.replicate: {"dex": 0.0, "read_on": "definition", "window": None} for p in runs}
    if role == "seed":
        return {}
    return early_doses(runs, of_role["precision"], of_role["seed"], window)


def _row(name, role, eps, job, early: dict, scores: dict, probe: dict, where: str, what: str) -> dict:
    a, b = (torch.tensor(scores[arm]["hits"][what], dtype=torch.bool) for arm in ("a", "b"))
    dex = early.get("dex")
    return {
        "pair": name,
        "role": "reference" if role in REFERENCE_ROLES else ("ladder" if role == LADDER_ROLE else "row"),
        "reference": role if role in REFERENCE_ROLES else None,
        "eps": eps,
        "replicate": job.replicate,
        "folder": str(job.out),
        "early_dex": dex if dex is not None and math.isfinite(dex) else None,
        "early_read_on": early.get("read_on"),
        "early_window": early.get("window"),
        "step": job.max_steps,
        "score_a": scores["a"]["rates"][what]["rate"],
        "score_b": scores["b"]["rates"][what]["rate"],
        "score_a_interval": scores["a"]["rates"][what]["bootstrap"],
        "score_b_interval": scores["b"]["rates"][what]["bootstrap"],
        "score_shift": dict(zip(("value", "lo", "hi"), paired_seed_bootstrap(a, b))),
        "probe_shift": probe.get(job.replicate),
        "probe_source": where,
    }


def _whole(record: dict) -> bool:
    """Whether a score record holds every attribute's hits and rate (one written before an attribute
    existed, or edited, is scored again)."""
    hits, rates = record.get("hits"), record.get("rates")
    return isinstance(hits, dict) and isinstance(rates, dict) and all(k in hits and k in rates for k in SCORED)


def _read(path: Path) -> dict | None:
    """A score.json's record, or None when there is none or it cannot be read (it is scored again)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def sample_panels(rows: list[dict], settings: ScoreSettings, device: str = "cpu") -> list[dict]:
    """The report's sample grids: for the lowest replicate, the references, the lowest and highest
    ladder rungs and every row, ``{"title", "a", "b", "score_a", "score_b"}`` (images of both arms)."""
    if not rows:
        return []
    first = min(r["replicate"] for r in rows)
    shown = [r for r in rows if r["replicate"] == first]
    ladder = sorted((r for r in shown if r["role"] == "ladder"), key=lambda r: r["eps"])
    picked = [r for r in shown if r["role"] != "ladder"] + ladder[:1] + ladder[1:][-1:]
    panels = []
    for r in picked:
        images = {arm: arm_samples(Path(r["folder"]), arm, r["step"], settings, device) for arm in ("a", "b")}
        panels.append(
            {
                "title": f"{r['pair']} (replicate {r['replicate']})",
                **images,
                **{f"score_{arm}": f"{settings.attribute} {100 * r['score_' + arm]:.0f}%" for arm in ("a", "b")},
            }
        )
    return panels


def seed_pair_series(jobs: list, consequence: Consequence, device: str = "cpu") -> tuple[dict, dict]:
    """``(score, probe)``, each ``{arm: {step: value}}`` over the seed pair's arms (every replicate,
    an arm shared between pairs once): the hit rate of ``score.attribute`` at the weights files of
    the recipe's ``train.checkpoint_every`` cadence and the last step (the tracker's denser files
    are left out), scored with the first ``PLATEAU_SEEDS`` sampling seeds (the last file's read from
    its ``score.json``), and the probe loss at every tracked step (the pair's store)."""
    from divergence.report.inputs import load_pair

    what = consequence.score.attribute
    score, probe, seen = {}, {}, set()
    for job in (j for j in jobs if j.pair.role == "seed"):
        data = load_pair(job.out)
        every = _checkpoint_every(data.recipe)
        for arm in ("a", "b"):
            folder = (job.out / arm).resolve()
            if folder in seen:
                continue
            seen.add(folder)
            name = f"{job.pair.name}#{job.replicate}/{arm}"
            series = {}
            for step, settings, final in _plateau(job, arm, every, consequence.score):
                record, _ = arm_score(job.out, arm, step, settings, device, final)
                hits = torch.tensor(record["hits"][what], dtype=torch.float64)[:PLATEAU_SEEDS]
                series[step] = float(hits.mean())
            score[name] = series
            losses = data.probe.get(f"probe_loss_{arm}")
            if losses is not None:
                probe[name] = {int(s): float(v) for s, v in zip(data.steps, losses) if math.isfinite(v)}
    return score, probe
