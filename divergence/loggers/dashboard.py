"""The wandb workspace of a study: what a team opens the morning after launching one.

``dashboard_sections`` says what the workspace shows, as plain data naming only keys the runs
log (``divergence.loggers.step_logging``, the attention callback, ``divergence.report.wandb_log``);
``build_workspace`` turns it into a ``wandb_workspaces`` Workspace (W&B's library for saved
views, https://docs.wandb.ai/guides/track/workspaces/) over the runs of one group.

Sections, top to bottom:

    Whole model             wasserstein, max_abs_diff, rel_l2 (log scale): every pair one line
    Per kind                each kind of layer's wasserstein and max_abs_diff (attn_q, conv, ...)
    Most divergent layers   the top layers at the last table step, and the layers x steps heatmaps
    Losses and spikes       both arms' losses on one chart, the spike flags, their difference
    Attention output        the shadow variant's per-arm max |O_primary - O_secondary| (empty
                            unless a shadow variant ran)
    Dose ratio              the report's log10 dose ratio per study pair, with its interval
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field

WORKSPACE_NAME = "divergence"


@dataclass(frozen=True)
class Panel:
    """One panel: ``kind`` line (``keys`` and/or ``regex``), table (``keys[0]`` a Table key),
    media (``keys`` image keys) or bar (``keys``: a Table key, its label and value columns)."""

    kind: str
    title: str
    keys: tuple[str, ...] = ()
    regex: str | None = None
    log_y: bool = False


@dataclass(frozen=True)
class Section:
    name: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def dashboard_sections() -> list[Section]:
    """What the workspace shows; every key or pattern is one the runs log."""
    model = tuple(
        Panel("line", f"{m} per pair (whole model)", (f"divergence/model/{m}",), log_y=True)
        for m in ("wasserstein", "max_abs_diff", "rel_l2")
    )
    kinds = tuple(
        Panel("line", f"{m} per kind of layer", regex=f"^divergence/kind/.*/{m}$", log_y=True)
        for m in ("wasserstein", "max_abs_diff")
    )
    return [
        Section("Whole model", model),
        Section("Per kind", kinds),
        Section(
            "Most divergent layers",
            (
                Panel("table", "top layers by wasserstein (last table step)", ("divergence/top_layers",)),
                Panel("media", "layers x steps (wasserstein | max_abs_diff)", ("divergence/heatmap",)),
            ),
        ),
        Section(
            "Losses and spikes",
            (
                Panel("line", "loss of both arms", ("train/loss_a", "train/loss_b")),
                Panel("line", "loss spikes (1: above k x the running median)", ("train/spike_a", "train/spike_b")),
                Panel("line", "loss_a - loss_b", ("train/loss_diff",)),
            ),
        ),
        Section(
            "Attention output",
            (
                Panel(
                    "line",
                    "attention-output max |O_primary - O_secondary| (shadow variant)",
                    regex="^attention/.*/max_abs_diff/all$",
                    log_y=True,
                ),
            ),
        ),
        Section(
            "Dose ratio",
            (
                Panel("table", "dose ratio per study pair (log10 E_X / E_P, 95% interval)", ("report/dose_ratios",)),
                Panel("bar", "log10 dose ratio", ("report/dose_ratios", "study", "log10")),
            ),
        ),
    ]


def build_workspace(entity: str, project: str, group: str | None = None, name: str = WORKSPACE_NAME):
    """The ``wandb_workspaces`` Workspace of ``dashboard_sections`` over the runs of ``group``."""
    import wandb_workspaces.workspaces as ws

    runset = ws.RunsetSettings(
        filters=group_filter(group) if group else "",
        pinned_columns=[
            "summary:divergence/model/wasserstein",
            "summary:divergence/model/max_abs_diff",
            "summary:divergence/model/rel_l2",
        ],
    )
    sections = [
        ws.Section(name=s.name, is_open=True, panels=[_panel(p) for p in s.panels]) for s in dashboard_sections()
    ]
    return ws.Workspace(
        entity=entity, project=project, name=view_name(name, group), sections=sections, runset_settings=runset
    )


def group_filter(group: str) -> str:
    """The runset filter on ``group``: a Python string literal, quotes escaped (wandb_workspaces
    parses the expression with ``ast``); a group it would change (it rewrites ``=``, ``<`` and
    ``>`` even inside strings) is a UserInputError, not a filter on another group."""
    import warnings

    import wandb_workspaces.expr as wandb_expr

    from divergence.errors import UserInputError

    text = f"Group = {group!r}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its note that it rewrote '<'
        parsed = wandb_expr.expr_to_filters(text).value
    if parsed != group:
        raise UserInputError(
            f"--group {group!r}: wandb_workspaces cannot filter on a group holding '=', '<' or '>' "
            f"(it would show group {parsed!r}); open the workspace without --group and filter there"
        )
    return text


def view_name(name: str, group: str | None) -> str:
    """``name - group``, without the characters wandb refuses in a view's name (symbols such as
    ``= + | $ ^`` and emoji: Unicode categories S* and Cs); UserInputError if ``name`` holds one."""
    from divergence.errors import UserInputError

    if not _displayable(name):
        raise UserInputError(f"--name {name!r}: wandb refuses symbols and emoji (such as = + | $ ^) in a view's name")
    shown = "".join(c for c in group or "" if _displayable(c))
    return name + (f" - {shown}" if shown else "")


def _displayable(text: str) -> bool:
    return not any(unicodedata.category(c).startswith(("S", "Cs")) for c in text)


def workspace_spec(workspace) -> dict:
    """The saved view as JSON-able data: exactly what ``Workspace.save`` sends to wandb."""
    return workspace._to_model().model_dump(mode="json", by_alias=True, exclude_none=True)


def _panel(panel: Panel):
    import wandb_workspaces.reports.v2 as wr

    if panel.kind == "line":
        return wr.LinePlot(title=panel.title, y=list(panel.keys), metric_regex=panel.regex, log_y=panel.log_y or None)
    if panel.kind == "table":
        return wr.WeavePanelSummaryTable(table_name=panel.keys[0])
    if panel.kind == "media":
        return wr.MediaBrowser(title=panel.title, media_keys=list(panel.keys), gallery_axis="step")
    if panel.kind == "bar":
        table, label, value = panel.keys
        chart = wr.CustomChart.from_table(
            table, chart_fields={"label": label, "value": value}, chart_strings={"title": panel.title}
        )
        chart.chart_name = "wandb/bar/v0"
        return chart
    raise ValueError(f"panel kind {panel.kind!r} is not one of line, table, media, bar")
