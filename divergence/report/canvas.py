"""A figure and its axes without pyplot: no global backend is chosen or switched (STYLE 18)."""

from __future__ import annotations

from matplotlib.figure import Figure


def subplots(*grid, figsize, **kwargs):
    """``pyplot.subplots`` without pyplot: ``(figure, axes)``."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*grid, **kwargs)
