"""Small drawing helpers shared by the book's figures (matplotlib only)."""

from __future__ import annotations

import math


def value_grid(ax, rows, title: str = "", row_labels=None, fmt: str = "{:g}", cmap: str = "Blues",
               shade=None, shade_range=None) -> None:
    """Draw a table of numbers: one row per rank, one cell per element; ``None`` cells stay blank.

    Rows may have different lengths (a rank's tensor before and after a gather, say). Cells
    are coloured by their value, or by ``shade`` (a table of the same shape) when given, on
    the fixed scale ``shade_range = (low, high)`` if given, so panels compare.
    """
    width = max((len(r) for r in rows), default=1)

    def padded(table):
        return [[(v if v is not None else math.nan) for v in r] + [math.nan] * (width - len(r)) for r in table]

    values = padded(rows)
    colours = padded(shade) if shade is not None else values
    finite = [v for r in colours for v in r if not math.isnan(v)]
    low, high = shade_range or ((min(finite), max(finite)) if finite else (0, 1))
    ax.imshow(colours, cmap=cmap, vmin=low - 0.15 * (high - low + 1), vmax=high + 0.6 * (high - low + 1),
              aspect="auto")
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            if not math.isnan(v):
                ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=9)
    ax.set_yticks(range(len(rows)), row_labels or [f"rank {i}" for i in range(len(rows))], fontsize=8)
    ax.set_xticks([])
    ax.set_title(title, fontsize=9)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)


def measured_label(fig, text: str = "measured on the machine that built this book") -> None:
    """The small print every measured figure carries."""
    fig.text(0.99, 0.005, text, ha="right", va="bottom", fontsize=7, color="0.4")


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun in the number it takes: ``counted(1, "rank") == "1 rank"``, ``"4 ranks"``."""
    return f"{n:g} {noun if n == 1 else (plural or noun + 's')}"
