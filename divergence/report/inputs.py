"""Find pair run folders and read them into ``PairData``.

A pair run folder holds ``pair.json`` and ``metrics.jsonl`` (written by paired training). The
report takes such folders, or folders that hold them one or two levels down (a study:
``OUT/<pair>/`` for one replicate, ``OUT/<pair>/r<k>/`` for several), so runs trained in
separate jobs or on other machines are reported on by copying them in.
"""

from __future__ import annotations

import copy
import json
from contextlib import contextmanager
from pathlib import Path

from divergence.analysis import PairData, pair_from_records
from divergence.errors import UserInputError
from divergence.pairfolder.folder import as_pair_folder
from divergence.pairfolder.layout import ARMS_FILE, METRICS_FILE, PAIR_FILE
from divergence.pairfolder.pair_json import PairInfo
from divergence.store import MetricsStore


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Every pair run folder named by ``paths`` (each a run folder or a folder of them)."""
    runs: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise UserInputError(f"{path}: not a folder; give a pair run folder or a study folder holding them")
        if _is_run(path):
            runs.append(path)
            continue
        found = _runs_below(path)
        if not found:
            raise UserInputError(
                f"{path}: no pair runs here (expected {PAIR_FILE} and {METRICS_FILE} in it "
                "or in its subfolders); point at the folder paired training wrote"
            )
        runs.extend(found)
    return list(dict.fromkeys(p.resolve() for p in runs))


def _runs_below(folder: Path) -> list[Path]:
    """Run folders directly under ``folder``, or one level further (a study's replicates)."""
    found = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if _is_run(sub):
            found.append(sub)
        else:
            found.extend(sorted(p for p in sub.iterdir() if p.is_dir() and _is_run(p)))
    return found


def load_pairs(paths: list[str | Path]) -> list[PairData]:
    """Read every pair run under ``paths``; (name, replicate) must be unique."""
    pairs, seen = [], {}
    for folder in find_runs(paths):
        pair = load_pair(folder)
        key = (pair.name, pair.replicate)
        if key in seen:
            raise UserInputError(
                f"{folder}: pair name {pair.name!r} replicate {pair.replicate} is also used by "
                f"{seen[key]}; report on one of them, or set another 'replicate' in its {PAIR_FILE}"
            )
        seen[key] = folder
        pairs.append(pair)
    return pairs


_loaded: dict | None = None  # (folder, its files' stats) -> PairData, while reuse_loaded_pairs is on


@contextmanager
def reuse_loaded_pairs():
    """Within it, ``load_pair`` reads each pair run once and hands out copies after: the atlas's
    reports each read all of a backbone's reference pair runs. A run whose ``pair.json`` or
    metrics store changed since (size or modification time) is read again."""
    global _loaded
    earlier, _loaded = _loaded, ({} if _loaded is None else _loaded)
    try:
        yield
    finally:
        _loaded = earlier


def keep_loaded_pairs() -> None:
    """``reuse_loaded_pairs`` for the rest of this process's life (a report worker's initializer)."""
    global _loaded
    if _loaded is None:
        _loaded = {}


def load_pair(folder: str | Path) -> PairData:
    """The pair run in ``folder``; a copy of the one read before under :func:`reuse_loaded_pairs`."""
    if _loaded is None:
        return _read_pair(Path(folder))
    paths = as_pair_folder(folder)
    key = (str(Path(folder).resolve()), *(_stat(f) for f in (paths.pair_json, paths.metrics)))
    if key not in _loaded:
        _loaded[key] = _read_pair(Path(folder))
    return copy.deepcopy(_loaded[key])  # the analysis may not change what the next report reads


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _read_pair(folder: Path) -> PairData:
    info = PairInfo.read(folder)
    store = MetricsStore(folder)
    if not store.exists():
        raise UserInputError(f"{store.path}: no metrics store here; was {folder} written by paired training?")
    try:
        return pair_from_records(
            info, store.step_records(), store.tensor_records(), folder=str(folder), replicate=_replicate(folder, info)
        )
    except (KeyError, TypeError) as err:
        raise UserInputError(
            f"{store.path}: a record lacks or mistypes the key {err}; was it written by this version of divergence?"
        ) from None


def _replicate(folder: Path, info: PairInfo) -> int:
    """pair.json's ``replicate``: an integer >= 0, else a one-line error naming the file."""
    value = info.replicate
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserInputError(
            f"{as_pair_folder(folder).pair_json}: 'replicate' is {value!r}; it must be an integer >= 0"
        )
    return value


def _is_run(path: Path) -> bool:
    folder = as_pair_folder(path)
    return folder.pair_json.is_file() or folder.metrics.is_file()


def study_arm_steps(paths: list[str | Path]) -> dict | None:
    """The arm-steps of the studies the inputs belong to (``arms.json`` in an input folder, its parent or
    grandparent: a study folder, ``<study>/<pair>`` or ``<study>/<pair>/r<N>``), summed over the studies:
    ``{"trained", "pair_by_pair"}``; None when no input lies in a study folder that has one."""
    found = {
        c.resolve()
        for p in map(Path, paths)
        for c in (p / ARMS_FILE, p.parent / ARMS_FILE, p.parent.parent / ARMS_FILE)
        if c.is_file()
    }
    total = {"trained": 0, "pair_by_pair": 0}
    for path in sorted(found):
        try:
            steps = json.loads(path.read_text())["arm_steps"]
            for key in total:
                total[key] += int(steps[key])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UserInputError(f"{path}: no arm_steps to read ({err}); remove it or run the study again") from None
    return total if found else None
