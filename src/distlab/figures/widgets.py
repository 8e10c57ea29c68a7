"""Interactive figures that keep working in the static, published book.

A widget whose slider calls Python needs a running kernel: in the published HTML nothing
would happen when a reader moves it. So the book's widgets compute *every* view in advance,
while the page executes, and let the browser switch between them: each picker's index is
linked (``jslink``, pure JavaScript) to a ``Stack`` of precomputed views. The widget state,
views included, is embedded in the page, so it works offline and without a kernel.

    explorer({"ranks": [2, 4, 8], "link": ["Ethernet", "InfiniBand"]},
             lambda ranks, link: figure_widget(make_plot(ranks, link)))

Keep the number of combinations small (each one is rendered and stored in the page).
"""

from __future__ import annotations

import io
from itertools import product

import ipywidgets as widgets


def figure_widget(fig, dpi: int = 90) -> widgets.Image:
    """A matplotlib figure as an image widget (and the figure closed, so it is not shown twice)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    plt.close(fig)
    return widgets.Image(value=palette_png(buffer.getvalue()), format="png")


def palette_png(png: bytes, colors: int = 256) -> bytes:
    """The same picture with at most ``colors`` colours: a third to a half of the bytes.

    A chart has a handful of colours plus the anti-aliased shades between them, which 256
    palette entries reproduce without a visible difference; a full-colour PNG stores 4 bytes a
    pixel and compresses poorly. An explorer embeds every view in the page, so this is what
    keeps a page of 30 views under a few megabytes.
    """
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT)
    buffer = io.BytesIO()
    image.save(buffer, format="png", optimize=True)
    return buffer.getvalue()


def explorer(options: dict[str, list], render, labels: dict[str, list[str]] | None = None) -> widgets.VBox:
    """Pickers for each option and the view ``render(**choice)`` for every combination.

    Args:
        options: ``{name: [values]}``; one row of buttons per name, in this order.
        render: called once per combination with the values as keyword arguments; returns a widget.
        labels: optional button captions per name (default: ``str(value)``).
    """
    names = list(options)
    if len(list(product(*options.values()))) > 200:
        raise ValueError("too many combinations to precompute: keep it under 200")
    labels = labels or {}
    pickers = [widgets.ToggleButtons(options=labels.get(name) or [str(v) for v in values], description=name,
                                     style={"description_width": "initial", "button_width": "auto"})
               for name, values in options.items()]

    def views(level: int, chosen: dict):
        if level == len(names):
            return render(**chosen)
        stack = widgets.Stack([views(level + 1, {**chosen, names[level]: value})
                               for value in options[names[level]]], selected_index=0)
        widgets.jslink((pickers[level], "index"), (stack, "selected_index"))
        return stack

    return widgets.VBox(pickers + [views(0, {})])
