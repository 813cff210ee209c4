"""Torch pickles (``.pt``, ``.pth``, ``.bin``) and Lightning ``.ckpt`` files, loaded safely.

Checkpoints can come from anywhere, and unpickling can run arbitrary code. Every pickle is
loaded with torch's weights-only unpickler: only tensors, plain containers and numbers are
rebuilt, plus a short allow-list of inert container types that Lightning writes into
``hyper_parameters`` (``AttributeDict``). A file that names any other global (``os.system``,
a user class) is refused whole, with the global's name (found by disassembling the pickle,
see ``pickle_scan``, where torch itself does not say), and nothing from it runs.

A file's declared sizes are checked before any tensor byte is read:

- it must be a zip archive (``torch.save`` since 1.6) or a pickle (the legacy format);
- zip files are first unpickled onto the ``meta`` device (shapes only, no data), each storage
  checked against its ``data/KEY`` record as a DCP chunk's is (``saved_tensor``), so a
  memory-mapped tensor can never reach past its record into the rest of the archive;
- no tensor may need more bytes, once materialized, than the whole file holds (a stride-0
  view can declare 10^12 elements over a one-element storage);
- the state dict is looked for at most ``MAX_DEPTH`` dictionaries deep; its entries that are
  not tensors (a module's ``_extra_state``) are left out, named in the source's ``skipped``.

Zip-format files are then memory-mapped, so a tensor's bytes are read when it is
compared, not when the file is opened.
"""

from __future__ import annotations

import pickle
import re
import warnings
import zipfile
from pathlib import Path

import torch

from divergence.checkpoints.files import check_path
from divergence.checkpoints.pickle_scan import referenced_globals, refusal
from divergence.checkpoints.saved_tensor import meta_storage, pickle_and_records, unpickle
from divergence.checkpoints.source import InMemorySource, check_comparable
from divergence.errors import CheckpointError

# Where the model weights sit inside common checkpoint dicts, in order of preference.
STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "weights")
MAX_DEPTH = 8
LEGACY_SCAN = 16 * 2**20  # bytes of a legacy-format file scanned for globals (its pickles come first)
INERT_GLOBALS = (
    ("lightning.fabric.utilities.data", "AttributeDict"),
    ("lightning_fabric.utilities.data", "AttributeDict"),
    ("pytorch_lightning.utilities.parsing", "AttributeDict"),
)
_ZIP_MAGIC, _PICKLE_MAGIC = b"PK\x03\x04", b"\x80"
_WHAT = "torch checkpoint"


def load_pickled(path: str | Path, prefix: str = "") -> InMemorySource:
    """The state dict inside a pickled checkpoint, as a tensor source; its entries that are not
    tensors (a module's ``_extra_state``) are left out and listed in the source's ``skipped``."""
    path = Path(path)
    entries = state_entries(load_checked(path), path)
    source = InMemorySource(path, _tensors_of(entries), prefix)
    source.skipped = {prefix + k: type(v).__name__ for k, v in entries.items() if not isinstance(v, torch.Tensor)}
    return source


def load_checked(path: str | Path):
    """The whole object of a pickled checkpoint, loaded weights-only after every check above
    (declared sizes against the storage present, no global beyond the inert ones)."""
    path = Path(path)
    size = check_path(path, folder_ok=False).st_size
    head = _head(path, 4)
    if head == _ZIP_MAGIC:
        data, records = _guarded(path, lambda: _archive(path))
        allowed = _inert_globals(data)
        # first onto ``meta``: every storage's declared size checked against its record (saved_tensor)
        tree = _guarded(
            path, lambda: unpickle(data, lambda id_: meta_storage(id_, records, str(path), _WHAT)), data, allowed
        )
        meta = find_state_dict(tree, path)
        _check_sizes(path, meta, size)
        for name, tensor in meta.items():  # before the real load: torch cannot even allocate some packed dtypes
            check_comparable(path, str(name), tensor.dtype)
        return _guarded(path, lambda: torch.load(path, map_location="cpu", weights_only=True, mmap=True), data, allowed)
    if not head.startswith(_PICKLE_MAGIC):
        raise CheckpointError(
            f"{path}: not a torch checkpoint (neither a zip archive nor a pickle: it starts with {head!r})"
        )
    head = _head(path, LEGACY_SCAN)
    allowed = _inert_globals(head)
    obj = _guarded(path, lambda: torch.load(path, map_location="cpu", weights_only=True), head, allowed)
    _check_sizes(path, find_state_dict(obj, path), size)
    return obj


def _head(path: Path, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read: {err.strerror or err}") from None


def _archive(path: Path) -> tuple[bytes, dict[str, zipfile.ZipInfo]]:
    """``data.pkl``'s bytes and the ``data/KEY`` records of a torch zip archive."""
    with zipfile.ZipFile(path) as archive:
        return pickle_and_records(archive, str(path), _WHAT)


def _guarded(path: Path, load, data: bytes = b"", allowed=()):
    """``load()`` with ``allowed`` globals beside torch's weights-only ones; any failure of the parser
    on an untrusted file (a broken archive, whatever zipfile says about it) is one ``CheckpointError``."""
    try:
        with torch.serialization.safe_globals(list(allowed)), warnings.catch_warnings():
            # torch warns about pickle protocols 4 and 5 before refusing them; the refusal says enough
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return load()
    except CheckpointError:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of the parser on an untrusted file is "corrupt"
        raise _load_error(path, err, data, allowed) from None


def _check_sizes(path: Path, state: dict, file_size: int) -> None:
    for name, tensor in state.items():
        need = tensor.numel() * tensor.element_size()
        if need > file_size:
            raise CheckpointError(
                f"{path}: tensor {name!r} declares shape {list(tensor.shape)} ({need:,} bytes once materialized) "
                f"but the file holds {file_size:,} bytes; refusing to allocate it"
            )


def _load_error(path: Path, err: BaseException, data: bytes = b"", allowed: list = ()) -> CheckpointError:
    if isinstance(err, pickle.UnpicklingError):
        advice = "; if you trust the file, re-save its state_dict with safetensors (safetensors.torch.save_file)"
        return refusal(path, err, data, allowed, advice) or CheckpointError(
            f"{path}: corrupt or not a torch checkpoint ({_first_line(err)})"
        )
    if isinstance(err, OSError) and not isinstance(err, zipfile.BadZipFile):
        return CheckpointError(f"{path}: cannot read: {err.strerror or err}")
    return CheckpointError(f"{path}: corrupt or truncated torch checkpoint ({type(err).__name__}: {_first_line(err)})")


def find_state_dict(obj, path: Path) -> dict[str, torch.Tensor]:
    """The ``{name: tensor}`` mapping in a loaded checkpoint (a Lightning ``.ckpt`` keeps it
    under ``state_dict``; training scripts often use ``model`` or ``model_state_dict``), without
    the state dict's entries that are not tensors."""
    return _tensors_of(state_entries(obj, path))


def state_entries(obj, path: Path) -> dict:
    """The state dict in a loaded checkpoint, every entry: a mapping of tensors, or one under a key
    of ``STATE_DICT_KEYS``, or, failing both, a mapping holding tensors beside other values (a
    module's ``get_extra_state()`` puts a dict or a string under ``<module>._extra_state``)."""
    for _ in range(MAX_DEPTH + 1):
        if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return {str(k): v for k, v in obj.items()}
        if not isinstance(obj, dict):
            raise CheckpointError(f"{path}: holds a {type(obj).__name__}, not a state dict of tensors")
        key = next((k for k in STATE_DICT_KEYS if isinstance(obj.get(k), dict)), None)
        if key is None and any(isinstance(v, torch.Tensor) for v in obj.values()):
            return {str(k): v for k, v in obj.items()}
        if key is None:
            keys = ", ".join(map(str, list(obj)[:8]))[:200]
            raise CheckpointError(
                f"{path}: no state dict found: top-level keys are {keys or '(none)'}; expected a mapping "
                f"of tensors or one of {', '.join(STATE_DICT_KEYS)}"
            )
        obj = obj[key]
    raise CheckpointError(f"{path}: no state dict within {MAX_DEPTH} nested dictionaries; is this a checkpoint?")


def _tensors_of(entries: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in entries.items() if isinstance(v, torch.Tensor)}


def _inert_globals(data: bytes) -> list:
    """Container classes that carry no code of their own and appear in real checkpoints, among
    those the pickle references (importing Lightning costs seconds; most files never need it)."""
    referenced = set(referenced_globals(data))
    found = []
    for module, name in [(m, n) for m, n in INERT_GLOBALS if f"{m}.{n}" in referenced]:
        try:
            found.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass  # that library is not installed: the file's reference to it is refused
    return found


def _first_line(err: BaseException) -> str:
    detail = re.search(r"WeightsUnpickler error: \s*(\S[^\n]*)", str(err))
    if detail:
        return detail.group(1)[:200]
    text = str(err).strip().splitlines()
    return text[0].split(". ")[0][:200] if text else type(err).__name__
