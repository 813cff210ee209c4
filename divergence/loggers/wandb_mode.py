"""Where a wandb run goes: the user's own wandb settings first, one rule for every command.

Mode (``wandb_init_mode``):

1. ``WANDB_MODE`` set: wandb follows it (``online``, ``offline``, ``disabled``, ...).
2. credentials present: ``WANDB_API_KEY``, or a ``netrc`` entry for the wandb host (what
   ``wandb login`` writes; the file is ``$NETRC`` or ``~/.netrc``, the host that of
   ``WANDB_BASE_URL``, default ``https://api.wandb.ai``): ``online``.
3. otherwise ``offline``: the run is written locally and ``offline_notice`` says, in one line,
   the ``wandb sync`` command that uploads it later.

The mode is passed to ``wandb.init`` explicitly: after a first run in the process, wandb no
longer reads ``WANDB_MODE`` from the environment.

Where (``wandb_target``): each of project, entity, group is the recipe's ``log.<key>`` when
set, else wandb's own environment variable (``WANDB_PROJECT``, ``WANDB_ENTITY``,
``WANDB_RUN_GROUP``), else the default (project ``divergence``, the user's default entity, the
study or pair folder's name). Tags are ours, then ``log.tags``, then ``WANDB_TAGS``. The run
folder is ``WANDB_DIR`` when set, else the run's own folder.
"""

from __future__ import annotations

import netrc
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

DEFAULT_PROJECT = "divergence"
# the x axis of every metric a run logs: the key Lightning's WandbLogger logs its step under,
# which the comparator's rows log too
STEP_KEY = "trainer/global_step"
DEFAULT_BASE_URL = "https://api.wandb.ai"


def has_credentials(env: dict | None = None) -> bool:
    """``WANDB_API_KEY`` set, or a netrc entry (``wandb login``) for the wandb host."""
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY"):
        return True
    host = urlparse(env.get("WANDB_BASE_URL") or DEFAULT_BASE_URL).hostname or ""
    path = Path(env["NETRC"]) if env.get("NETRC") else Path(env.get("HOME") or Path.home()) / ".netrc"
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def wandb_init_mode(env: dict | None = None) -> str:
    """``WANDB_MODE`` when set, else ``online`` with credentials, else ``offline``."""
    env = os.environ if env is None else env
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"]
    return "online" if has_credentials(env) else "offline"


def wandb_offline(env: dict | None = None) -> bool:
    return wandb_init_mode(env) in ("offline", "dryrun")


def offline_notice(run_dir: str | Path, env: dict | None = None) -> str:
    """The one line an offline run prints: why it is offline and how to upload it."""
    env = os.environ if env is None else env
    why = (
        f"WANDB_MODE={env['WANDB_MODE']}"
        if env.get("WANDB_MODE")
        else "no WANDB_MODE, WANDB_API_KEY or `wandb login` credentials"
    )
    return f"wandb: {run_dir} is an offline run ({why}); upload it later with: wandb sync {run_dir}"


@dataclass(frozen=True)
class WandbTarget:
    """Arguments of ``wandb.init`` that say where a run goes and how it is filed."""

    project: str
    entity: str | None
    group: str
    tags: tuple[str, ...]
    dir: str
    mode: str


def wandb_target(
    log, default_group: str, tags: tuple[str, ...], run_dir: str | Path, env: dict | None = None
) -> WandbTarget:
    """Resolve project, entity, group, tags, folder and mode (``log``: a LogConfig or None)."""
    env = os.environ if env is None else env
    project = getattr(log, "project", None) or env.get("WANDB_PROJECT") or DEFAULT_PROJECT
    entity = getattr(log, "entity", None) or env.get("WANDB_ENTITY") or None
    group = getattr(log, "group", None) or env.get("WANDB_RUN_GROUP") or default_group
    extra = [t.strip() for t in (env.get("WANDB_TAGS") or "").split(",") if t.strip()]
    all_tags = tuple(dict.fromkeys([*tags, *getattr(log, "tags", ()), *extra]))  # ordered, no repeats
    return WandbTarget(
        project=project,
        entity=entity,
        group=group,
        tags=tuple(t[:64] for t in all_tags),
        dir=env.get("WANDB_DIR") or str(run_dir),
        mode=wandb_init_mode(env),
    )


def key_part(name: str) -> str:
    """``name`` as one segment of a metric key that wandb's run table can sort and filter by.

    wandb asks metric names to match ``[_a-zA-Z][_a-zA-Z0-9]*`` (its GraphQL naming rule;
    https://docs.wandb.ai/support/models/articles/why-cant-i-sort-or-filter-metrics-with-c):
    dots (read as nesting), hyphens and spaces become ``_``, a leading digit gets a ``_``.

    >>> key_part("down_blocks.0.attentions.1"), key_part("flash-vs-baseline"), key_part("0")
    ('down_blocks_0_attentions_1', 'flash_vs_baseline', '_0')
    """
    part = re.sub(r"[^_a-zA-Z0-9]", "_", name) or "_"
    return "_" + part if part[0].isdigit() else part
