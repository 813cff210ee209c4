"""The report of a bounding study: figures, ``report.html``, ``report.md``, ``summary.json``,
and the same logged to wandb. Reads pair run folders (the store), never the trainer."""

from divergence.report.build import Report, build_report

__all__ = ["Report", "build_report"]
