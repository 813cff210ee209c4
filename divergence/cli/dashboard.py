"""``divergence dashboard --entity E --project P [--group G] [--dry-run]``: a saved wandb workspace.

Writes the study's workspace (``divergence.loggers.dashboard``: whole-model metrics per pair, per-kind
trends, the most divergent layers, both arms' losses with spikes, the attention-output deviation,
the dose ratio) to wandb as a saved view of project ``P``, showing the runs of group ``G``.
``--dry-run`` prints the workspace as JSON and sends nothing (no credentials needed).
"""

from __future__ import annotations

import argparse
import os
import sys

from divergence.errors import UserInputError
from divergence.loggers.wandb_mode import has_credentials

HELP = "write the wandb workspace of a study (its runs' charts, tables and heatmaps) as a saved view"


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("dashboard", help=HELP, description=HELP + ".")
    p.add_argument(
        "--entity", default=os.environ.get("WANDB_ENTITY"), help="wandb entity, a user or team (default: $WANDB_ENTITY)"
    )
    p.add_argument(
        "--project",
        default=os.environ.get("WANDB_PROJECT"),
        help="wandb project the runs went to (default: $WANDB_PROJECT)",
    )
    p.add_argument("--group", help="show only the runs of this group (a study or pair folder's name)")
    p.add_argument("--name", default=None, help="the view's name (default: divergence[ - GROUP])")
    p.add_argument("--dry-run", action="store_true", help="print the workspace as JSON; send nothing")
    return p


def run(args) -> int:
    import json

    for flag, value, env in (("--entity", args.entity, "WANDB_ENTITY"), ("--project", args.project, "WANDB_PROJECT")):
        if not value:
            raise UserInputError(f"{flag} is missing: give {flag} NAME (or set {env})")
    from divergence.extras import require

    require("wandb", "wandb", "wandb_workspaces")
    from divergence.loggers.dashboard import WORKSPACE_NAME, build_workspace, workspace_spec

    workspace = build_workspace(args.entity, args.project, args.group, args.name or WORKSPACE_NAME)
    if args.dry_run:
        print(json.dumps(workspace_spec(workspace), indent=1))
        return 0
    if not has_credentials():
        raise UserInputError(
            "no wandb credentials: run `wandb login` or set WANDB_API_KEY (or use --dry-run to print the workspace)"
        )
    try:
        workspace.save()
    except Exception as err:  # noqa: BLE001 - network and server trouble: one line, not a traceback
        print(
            f"divergence dashboard: error: saving the workspace to wandb failed ({type(err).__name__}: {err})",
            file=sys.stderr,
        )
        return 1
    print(f"dashboard: {workspace.url}")
    return 0
