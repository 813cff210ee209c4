"""A tracked step's weights as a ``torch.distributed.checkpoint`` (DCP) folder, written by every rank.

::

    <arm>/checkpoints/step_000120.dcp/
        __0_0.distcp, __1_0.distcp, ...   each rank's shards (DCP's FileSystemWriter, fsynced)
        .metadata                         DCP's index of the chunks (written by its coordinator)
        complete.json                     the completion marker: written last, by rank 0

``ArmWriter(..., format="dcp")`` saves a sharded model (FSDP2's DTensors, tensor-parallel
shards) this way: every rank writes its own shards (``torch.distributed.checkpoint.save``), no
rank gathers the model. The order (``save_dcp``): rank 0 removes an earlier attempt's folder of
the step, a barrier, every rank saves, a barrier (all shards are on disk), then rank 0 writes
``complete.json`` atomically (``divergence.atomic``): ``{"format", "step", "arm", "files":
{name: bytes}}``, the size of every file DCP wrote. A reader takes the folder only when its
marker names the step and every listed file has its size (``completed``); a folder without
it is being written (or its writer died) and is "not there yet", as a safetensors file whose
CRC does not match is (``weights_file.completed``). The marker's identity (inode, size, mtime)
stands for the folder's (``identity``): a step written again gets a new marker.

Without a process group (one process), ``save`` runs without collectives and the order is the
same. The folder is read by ``divergence.checkpoints.dcp`` (nothing in it is unpickled by
torch's own reader).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

from divergence.atomic import atomic_file
from divergence.pairfolder.layout import DCP_COMPLETE_FILE

FORMAT = "divergence.weights-dcp/1"


def save_dcp(path: str | Path, state: dict, *, step: int, arm: str, writer: bool) -> Path:
    """Every rank: save ``state`` (its shards) into the DCP folder ``path``; rank 0 (``writer``) marks
    it complete once every rank has finished. A collective: call it on every rank of the group."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    group = dist.is_available() and dist.is_initialized()
    if writer:
        remove_weights(path)  # an earlier attempt's folder of this step (a restart writes it again)
        path.parent.mkdir(parents=True, exist_ok=True)
    if group:
        dist.barrier()
    with warnings.catch_warnings():  # no_dist: torch warns it assumes one process, which it is
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.save(state, checkpoint_id=path, no_dist=not group)
    if group:
        dist.barrier()  # every rank's shards and DCP's .metadata are written and fsynced
    if writer:
        files = {
            p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file() and p.name != DCP_COMPLETE_FILE
        }
        marker = {"format": FORMAT, "step": step, "arm": arm, "files": files}
        with atomic_file(path / DCP_COMPLETE_FILE, "w") as f:
            json.dump(marker, f, sort_keys=True)
    return path


def completed(path: str | Path, step: int) -> tuple[int, int, int] | None:
    """The identity of the DCP folder ``path`` of ``step`` when its marker is there, names ``step`` and
    every file it lists has its size; else None (being written, a writer that died, replaced)."""
    path = Path(path)
    found = identity(path)
    try:
        marker = json.loads((path / DCP_COMPLETE_FILE).read_text())
        files = marker["files"]
        if marker.get("format") != FORMAT or marker.get("step") != step or not isinstance(files, dict):
            return None
        if any(os.stat(path / name).st_size != size for name, size in files.items()):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if found is not None and found == identity(path) else None


def identity(path: str | Path) -> tuple[int, int, int] | None:
    """``(inode, size, mtime_ns)`` of the folder's marker, None while it has none."""
    try:
        st = os.stat(Path(path) / DCP_COMPLETE_FILE)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def remove_weights(path: str | Path) -> None:
    """Remove a weights file or DCP folder (nothing when it is gone); a folder's marker goes first, so
    a reader never takes a folder being removed."""
    path = Path(path)
    if path.is_dir():
        (path / DCP_COMPLETE_FILE).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
