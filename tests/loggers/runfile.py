"""Read what wandb wrote: the records of offline ``.wandb`` run files (run, metric, history, ...).

The file format is read by ``tests.pairs.helpers._leveldb_records`` (wandb 0.31 ships no
reader); each record is a ``wandb_internal_pb2.Record``.
"""

import json
from pathlib import Path

from tests.pairs.helpers import _leveldb_records


def run_files(root: Path) -> list[Path]:
    return sorted(Path(root).glob("**/wandb/offline-run-*/run-*.wandb"))


def records(path: Path, kind: str | None = None) -> list:
    from wandb.proto import wandb_internal_pb2

    out = []
    for data in _leveldb_records(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if kind is None or record.WhichOneof("record_type") == kind:
            out.append(record)
    return out


def run_info(path: Path) -> dict:
    """group, job_type, tags, project and config (``{key: value}``) of the file's run record."""
    run = records(path, "run")[0].run
    config = {item.key: json.loads(item.value_json) for item in run.config.update if item.key != "_wandb"}
    for record in records(path, "config"):  # later config updates (Lightning's log_hyperparams)
        config.update({item.key: json.loads(item.value_json) for item in record.config.update})
    return {
        "group": run.run_group,
        "job_type": run.job_type,
        "tags": list(run.tags),
        "project": run.project,
        "config": config,
    }


def defined_metrics(path: Path) -> dict[str, dict]:
    """``{name or glob: {"step_metric": ..., "summary": set of summaries}}`` of define_metric calls."""
    out = {}
    for record in records(path, "metric"):
        m = record.metric
        summary = {f.name for f, value in m.summary.ListFields() if value is True}
        out[m.name or m.glob_name] = {"step_metric": m.step_metric, "summary": summary}
    return out


def history_keys(path: Path) -> set[str]:
    """Every key logged; a media or Table value (logged as ``KEY/_type``, ``KEY/path``, ...) is ``KEY``."""
    keys = set()
    for record in records(path, "history"):
        keys |= {item.key or "/".join(item.nested_key) for item in record.history.item}
    media = {k.rsplit("/", 1)[0] for k in keys if k.endswith("/_type")}
    return {k for k in keys if not any(k.startswith(m + "/") for m in media)} | media


def summary_values(path: Path) -> dict:
    """The last summary value of each key (a dict for max/min summaries)."""
    out = {}
    for record in records(path, "summary"):
        for item in record.summary.update:
            out[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out


def logged_artifacts(path: Path) -> dict[str, str]:
    """``{artifact name: type}`` of the artifacts the run logged."""
    return {r.artifact.name: r.artifact.type for r in records(path, "artifact")}
