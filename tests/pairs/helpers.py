"""Tiny pair runs for tests: the shipped pair recipes, shrunk to seconds."""

import json
from pathlib import Path

from divergence.variants.pair_recipe import load_pair_recipe
from tests.training.tiny import DIT, FAST  # noqa: F401  (DIT: for the pair tests)

PAIRS = Path(__file__).resolve().parents[2] / "recipes" / "pairs"
PAIR_FAST = (*FAST, "sample.enabled=false", "train.cpu_threads=1", "tracking.probe.size=4")


def pair_recipe(name: str, *overrides: str):
    return load_pair_recipe(PAIRS / f"{name}.yaml", [*PAIR_FAST, *overrides])


def store_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def step_records(out: Path) -> dict[int, dict]:
    return {r["step"]: r for r in store_lines(out) if r["type"] == "step"}


def wandb_history(out: Path) -> list[dict]:
    """History rows ({key: value json}) of every offline wandb run under ``out/wandb``.

    wandb 0.31 ships no reader for its ``.wandb`` files, so this reads the format directly:
    a 7-byte file header (``:W&B``, magic, version), then LevelDB-log records in 32 KiB
    blocks: crc32 (4) + length (2, little-endian) + type (1: full, 2: first, 3: middle,
    4: last), each holding a serialized ``wandb_internal_pb2.Record``.
    """
    from wandb.proto import wandb_internal_pb2

    rows = []
    for path in sorted(out.glob("wandb/offline-run-*/run-*.wandb")):
        for data in _leveldb_records(path.read_bytes()):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") == "history":
                row = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item
                }
                rows.append(dict(row, _step=record.history.step.num, _file=path.parent.name))
    return rows


def wandb_synced_steps(rows: list[dict], key: str) -> list[int]:
    """The steps holding ``key`` once wandb applies its rule for a resumed run: files in the
    order they were written, and a step at or below the last one already held is ignored."""
    kept, last = [], -1
    for row in rows:  # files sorted by name: offline-run-<start time>
        if row["_step"] > last:
            last = row["_step"]
            if key in row:
                kept.append(row["_step"])
    return kept


def _leveldb_records(raw: bytes, block: int = 32768):
    assert raw[:4] == b":W&B", "not a wandb run file"
    pos, pending = 7, b""
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # block trailer: zero padding
            pos += block - pos % block
            continue
        length = int.from_bytes(raw[pos + 4 : pos + 6], "little")
        kind = raw[pos + 6]
        data = raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield data
        elif kind in (2, 3):
            pending += data
        elif kind == 4:
            yield pending + data
            pending = b""
        else:
            return  # zero-filled tail of a file still being written
