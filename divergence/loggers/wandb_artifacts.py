"""wandb artifacts of a run folder: the metrics store, and weights at chosen steps.

    store-<pair>[-r<replicate>]    type ``store``: the pair's ``metrics.jsonl``, logged by the run
                                   that wrote it (the lockstep pair, or the comparator) when it
                                   finishes; the report ``use``s it, so wandb's lineage graph
                                   goes from the report to the runs it was computed from.
    weights-<run>-step<N>          type ``model``: the weights-only checkpoints of step N under the
                                   run folder (both arms' for a lockstep pair), for each step of
                                   ``log.artifacts`` (opt-in; empty by default).

Artifacts are content-addressed: the report builds the store artifact from the same file and
wandb resolves it to the version the pair run logged (same digest), online. An offline run
cannot ``use`` an artifact (wandb refuses); the report then records the artifacts' names and
digests in its config instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

from divergence.errors import UserInputError
from divergence.pairfolder.pair_json import PairInfo
from divergence.recipe.names import NAME, file_stem
from divergence.pairfolder.folder import as_pair_folder
from divergence.pairfolder.layout import METRICS_FILE


def artifact_slug(name: str) -> str:
    """wandb artifact names allow letters, digits, ``-``, ``_`` and ``.``: a name that follows the
    name rule as it is, any other with its hash (``divergence.recipe.names.file_stem``), so two
    names never share an artifact."""
    return name if NAME.fullmatch(name) else file_stem(name)


def store_artifact_name(folder: str | Path) -> str | None:
    """``store-<pair>[-r<replicate>]`` for a pair folder, or None when it holds no store."""
    folder = Path(folder)
    if not as_pair_folder(folder).metrics.is_file():
        return None
    try:
        info = PairInfo.read(folder)
        name, replicate = info.name, getattr(info, "replicate", 0) or 0
    except UserInputError:  # a store without a readable pair.json: name it after the folder
        name, replicate = folder.resolve().name, 0
    return f"store-{artifact_slug(name)}" + (f"-r{replicate}" if replicate else "")


def store_artifact(folder: str | Path):
    """The store of ``folder`` as a ``wandb.Artifact`` (None without a store)."""
    import wandb

    name = store_artifact_name(folder)
    if name is None:
        return None
    artifact = wandb.Artifact(name, type="store", description=f"metrics store of the pair run {Path(folder).name}")
    artifact.add_file(str(as_pair_folder(folder).metrics), name=METRICS_FILE)
    return artifact


def weights_artifact(folder: str | Path, run_name: str, step: int):
    """Every weights-only checkpoint of ``step`` under ``folder`` (None when there is none)."""
    import wandb

    folder = Path(folder)
    from divergence.pairfolder.layout import CHECKPOINTS_DIR, weights_name

    target = weights_name(step)
    files = sorted(p for p in folder.rglob(target) if p.parent.name == CHECKPOINTS_DIR)
    if not files:
        return None
    artifact = wandb.Artifact(f"weights-{artifact_slug(run_name)}-step{step}", type="model", metadata={"step": step})
    for path in files:
        artifact.add_file(str(path), name=path.relative_to(folder).as_posix())
    return artifact


def log_run_artifacts(run, folder: str | Path, steps: tuple[int, ...] = ()) -> list[str]:
    """Log the store of ``folder`` (if any) and the weights of ``steps``; return the names logged."""
    logged = []
    store = store_artifact(folder)
    if store is not None:
        run.log_artifact(store)
        logged.append(store.name)
    for step in steps:
        artifact = weights_artifact(folder, run.name or Path(folder).name, step)
        if artifact is None:
            print(
                f"log.artifacts: no weights-only checkpoint of step {step} under {folder}; nothing logged "
                "for it (checkpoints are written every train.checkpoint_every steps and at the end)",
                file=sys.stderr,
            )
            continue
        run.log_artifact(artifact)
        logged.append(artifact.name)
    return logged
