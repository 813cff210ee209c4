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
CRC does not match is (``weights_file.completed``). A folder whose marker names the other arm
(copied from it) is refused. The marker's identity (inode, size, mtime) stands for the
folder's (``identity``): a step written again gets a new marker.

A tied parameter (``lm_head.weight`` is ``wte.weight``: ``divergence.checkpoints.tied``) is
saved once, under its first name, and the marker lists its other names (``"tied": {kept:
[names]}``, only when there are any), as a safetensors weights file does in its metadata: the
whole-model figures count it once whatever the format. Every rank must drop the same names
(DCP's save plans a collective), while a rank whose shard of the tensor is empty sees no
storage to share: the ranks' ties are gathered and merged first.

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
from divergence.checkpoints.tied import read_marker
from divergence.errors import CheckpointError
from divergence.pairfolder.layout import ARMS, DCP_COMPLETE_FILE

FORMAT = "divergence.weights-dcp/1"


def save_dcp(path: str | Path, state: dict, *, step: int, arm: str, writer: bool) -> Path:
    """Every rank: save ``state`` (its shards) into the DCP folder ``path``; rank 0 (``writer``) marks
    it complete once every rank has finished. A collective: call it on every rank of the group."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    group = dist.is_available() and dist.is_initialized()
    state, tied = _untied(state, group)
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
        marker = {"format": FORMAT, "step": step, "arm": arm, "files": files, **({"tied": tied} if tied else {})}
        with atomic_file(path / DCP_COMPLETE_FILE, "w") as f:
            json.dump(marker, f, sort_keys=True)
    return path


def _untied(state: dict, group: bool) -> tuple[dict, dict[str, list[str]]]:
    """``state`` without the second and later names of a tied tensor, and ``{kept: [names]}``: the
    same on every rank (the union of each rank's ties, in the state's order)."""
    import torch.distributed as dist

    from divergence.checkpoints.tied import untie

    tied = untie(state)[1]
    if group:
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, tied)
        merged: dict[str, list[str]] = {}
        for ties in everyone:
            for kept, names in ties.items():
                known = merged.setdefault(kept, [])
                known += [n for n in names if n not in known]
        tied = {k: merged[k] for k in state if k in merged}
    dropped = {name for names in tied.values() for name in names}
    return {k: v for k, v in state.items() if k not in dropped}, tied


def completed(path: str | Path, step: int, arm: str | None = None) -> tuple[int, int, int] | None:
    """The identity of the DCP folder ``path`` of ``step`` when its marker is there, names ``step`` and
    every file it lists has its size; else None (being written, a writer that died, replaced).
    A complete folder whose marker names another arm than ``arm`` is a ``CheckpointError``."""
    path = Path(path)
    found = identity(path)
    if found is None:
        return None
    try:
        text = read_marker(path / DCP_COMPLETE_FILE)  # a FIFO, a device or a huge file: refused, not read
    except OSError:  # removed meanwhile
        return None
    try:
        marker = json.loads(text)
        files = marker["files"]
        if marker.get("format") != FORMAT or marker.get("step") != step or not isinstance(files, dict):
            return None
        if any(os.stat(path / name).st_size != size for name, size in files.items()):
            return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    if arm is not None and marker.get("arm") != arm:
        named = marker.get("arm")
        named = named if named in ARMS else repr(str(named)[:40])
        raise CheckpointError(
            f"{path}: its {DCP_COMPLETE_FILE} names arm {named}, but the folder lies in arm {arm}'s checkpoints "
            f"(copied from the other arm?); a pair compares each arm's own weights: put arm {arm}'s weights of "
            f"step {step} there, or train arm {arm} again from before it"
        )
    return found if found is not None and found == identity(path) else None


def identity(path: str | Path) -> tuple[int, int, int] | None:
    """``(inode, size, mtime_ns)`` of weights file ``path`` now, or of a DCP folder's marker (see
    ``completed``); None when it is gone (a folder: while it has no marker)."""
    path = Path(path)
    try:
        st = os.stat(path / DCP_COMPLETE_FILE if path.is_dir() else path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def remove_weights(path: str | Path) -> None:
    """Remove a weights file or DCP folder (nothing when it is gone); a folder's marker goes first, so
    a reader never takes a folder being removed. A symbolic link is removed itself, not followed."""
    path = Path(path)
    if path.is_symlink():  # a link put there by hand: the link goes, never what it points to
        path.unlink(missing_ok=True)
    elif path.is_dir():
        (path / DCP_COMPLETE_FILE).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
