"""The run's Lightning loggers: wandb (the user's settings first), CSV, TensorBoard.

wandb's mode, project, entity, group, tags and folder follow ``divergence.loggers.wandb_mode``.
The run id is kept in ``<out>/wandb-id`` so a resumed run continues the same wandb run.

Every run of a pair or study is filed the way a wandb user expects: one ``group`` (the study
or pair folder's name), ``job_type`` ``arm``, ``pair``, ``comparator`` (and ``report``, see
``divergence.report.wandb_log``), tags naming the pair, its category, replicate and variants,
and the resolved recipe as the run's config. ``define_metric`` gives every key the step axis
``trainer/global_step`` and a summary: ``max`` for spikes and max differences, ``last`` for the
rest (``divergence.loggers.step_logging.define_keys``).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from lightning.pytorch.loggers import WandbLogger

from divergence.pairfolder.folder import RunFolder, as_run_folder
from divergence.pairfolder.settings import LogConfig
from divergence.loggers.wandb_mode import STEP_KEY, offline_notice, wandb_offline, wandb_target

__all__ = ["RunIdentity", "DivergenceWandbLogger", "build_loggers", "finish_wandb", "wandb_offline"]


@dataclass(frozen=True)
class RunIdentity:
    """How one wandb run is filed: its job type, default group, tags and config."""

    job_type: str  # arm, pair, comparator (report: the report's own run)
    group: str  # default group: the study or pair folder's name
    tags: tuple[str, ...] = ()
    config: dict = field(default_factory=dict)  # the resolved recipe

    @classmethod
    def for_pair(cls, pair, out: Path, config: dict, job_type: str = "pair", arm: str | None = None) -> "RunIdentity":
        """A pair's run: ``config`` is the resolved pair recipe (the trainer's ``pair_config``)."""
        tags = pair_tags(pair.name, pair.category, pair.labels(), getattr(pair, "replicate", 0), arm)
        return cls(job_type, Path(out).resolve().name, tags, config)

    @classmethod
    def for_comparator(cls, out: Path, config: dict) -> "RunIdentity":
        """The comparator of the pair folder ``out`` (its pair.json names the pair)."""
        from divergence.pairfolder.pair_json import PairInfo

        info = PairInfo.read(out)
        tags = pair_tags(info.name, info.category, info.arms, getattr(info, "replicate", config.get("replicate", 0)))
        return cls("comparator", Path(out).resolve().name, tags, config)

    @classmethod
    def for_run(cls, recipe, out: Path) -> "RunIdentity":
        from divergence.config.schema import to_dict

        return cls("arm", Path(out).resolve().name, (f"run:{recipe.name}",), to_dict(recipe))


def pair_tags(name: str, category: str, labels: dict, replicate: int = 0, arm: str | None = None) -> tuple[str, ...]:
    """``pair:<name>``, ``category:<c>``, ``replicate:<n>``, each arm's variants (``a:<label>``,
    ``a:base`` for none) and, for one arm's job, ``arm:<a>``."""
    tags = [f"pair:{name}", f"category:{category}", f"replicate:{replicate or 0}"]
    for side, variants in labels.items():
        if arm in (None, side):
            tags += [f"{side}:{label.split('(')[0]}" for label in variants] or [f"{side}:base"]  # no options
    if arm is not None:
        tags.append(f"arm:{arm}")
    return tuple(tags)


class DivergenceWandbLogger(WandbLogger):
    """Lightning's WandbLogger that defines our metrics and says where an offline run went.

    ``log_config`` rides along for the step logger (per-layer scalars); ``store_dir`` is the
    folder whose files the run's artifacts come from.
    """

    def __init__(self, *args, log_config: LogConfig, store_dir: Path, **kwargs):
        super().__init__(*args, **kwargs)
        self.log_config, self.store_dir = log_config, Path(store_dir)
        self.defined_keys: set[str] = set()
        # what decided the mode, read before wandb.init (which sets WANDB_MODE itself)
        self.mode_env = {k: os.environ[k] for k in ("WANDB_MODE",) if os.environ.get(k)}

    @property
    def experiment(self):
        first = self._experiment is None
        run = WandbLogger.experiment.fget(self)
        if first and self._experiment is not None and hasattr(run, "define_metric"):
            # what Lightning logs itself (an arm's own train/loss, grad_norm, lr): a glob; every key
            # that goes through ``step_logging.log_at_step`` is defined by name when first logged
            run.define_metric("train/*", step_metric=STEP_KEY, summary="last")
            if run.settings.mode in ("offline", "dryrun") or getattr(run, "offline", False):
                print(offline_notice(Path(run.dir).parent, self.mode_env), flush=True)
        return run


def build_loggers(config: LogConfig, out: RunFolder | Path, run_name: str, identity: RunIdentity | None = None) -> list:
    """The run's loggers; ``identity`` files its wandb run (default: a run of its own in ``out``)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    from divergence.loggers.csv_rows import ContinuedCSVLogger

    out = as_run_folder(out)

    loggers = []
    if config.wandb:
        import wandb

        identity = identity or RunIdentity("arm", out.path.resolve().name)
        target = wandb_target(config, identity.group, identity.tags, out.path)
        offline = target.mode in ("offline", "dryrun")
        loggers.append(
            DivergenceWandbLogger(
                name=run_name,
                project=target.project,
                entity=target.entity,
                save_dir=target.dir,
                id=_wandb_id(out),
                offline=offline,
                resume="allow",
                mode=target.mode,
                group=target.group,
                job_type=identity.job_type,
                tags=list(target.tags),
                config=identity.config,
                log_config=config,
                store_dir=out.path,
                **({"settings": wandb.Settings(silent=True)} if offline else {}),  # offline: our one line only
            )
        )
    if config.csv:
        loggers.append(ContinuedCSVLogger(save_dir=str(out.csv_dir.parent), name=out.csv_dir.name, version=""))
    if config.tensorboard:
        loggers.append(
            TensorBoardLogger(save_dir=str(out.tensorboard_dir.parent), name=out.tensorboard_dir.name, version="")
        )
    return loggers


def finish_wandb(loggers, artifacts: bool = True) -> None:
    """Log the run's artifacts (``artifacts``) and close its wandb run (Lightning leaves it open,
    and the next WandbLogger in the same process, a study's next pair, would log into it)."""
    from divergence.loggers.wandb_artifacts import log_run_artifacts

    for logger in loggers:
        if isinstance(logger, WandbLogger) and logger._experiment is not None:
            if artifacts and isinstance(logger, DivergenceWandbLogger):
                log_run_artifacts(logger.experiment, logger.store_dir, logger.log_config.artifacts)
            logger.experiment.finish()


def _wandb_id(folder: RunFolder) -> str:
    """The run's wandb id, made and kept by global rank zero (the only rank that logs to wandb)."""
    from divergence.atomic import write_atomic

    path, out = folder.wandb_id, folder.path
    if path.is_file():
        return path.read_text().strip()
    out.mkdir(parents=True, exist_ok=True)
    run_id = secrets.token_hex(4)  # wandb ids: 8 lowercase alphanumerics
    if global_rank_zero():
        write_atomic(path, run_id + "\n")
    return run_id


def global_rank_zero() -> bool:
    """This process is global rank zero (before a Trainer exists: from the launcher's environment,
    as Lightning reads it: ``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID``)."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0
