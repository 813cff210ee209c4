"""The report's one way of laying out and writing a figure (``divergence.report.canvas``)."""

from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.layout_engine import TightLayoutEngine
from PIL import Image

from divergence.report.canvas import save, subplots


def _labelled(label: str):
    fig, ax = subplots(figsize=(4, 3))
    ax.set_yticks(range(30))
    ax.set_yticklabels([f"{label} layer {i}" for i in range(30)], fontsize=7)
    ax.set_title(f"{label}: the top layers")
    return fig


def _counting(monkeypatch) -> list:
    """A spy on the Agg renderer's text measure (matplotlib caches its results per renderer)."""
    calls, measure = [], RendererAgg.get_text_width_height_descent

    def counted(self, *args, **kwargs):
        calls.append(args[0])
        return measure(self, *args, **kwargs)

    monkeypatch.setattr(RendererAgg, "get_text_width_height_descent", counted)
    return calls


def test_a_figure_is_laid_out_at_the_pixels_it_is_drawn_at_and_its_texts_measured_once(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    path = save(_labelled("once"), tmp_path / "once.png", 110)
    once = len(calls)
    assert Image.open(path).size == (440, 330)
    assert once >= 31 and len(set(calls)) == once  # each label and the title, measured by one renderer

    calls.clear()  # as before: laid out at the figure's 100 dpi, drawn at 110, by two renderers
    fig = _labelled("twice")
    TightLayoutEngine().execute(fig)
    fig.savefig(tmp_path / "twice.png", dpi=110)
    assert len(calls) >= 2 * once - 2
