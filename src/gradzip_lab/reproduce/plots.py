"""The line plot that most reproductions draw: one or more curves against the iteration (or
another x), saved as a PNG. Figures of their own shape (two panels, shaded ranges, scatter
plots, image grids) are drawn where they are used."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

#: one curve: its legend label, its x values and its y values
Series = tuple[str, Sequence[float], Sequence[float]]


def line_plot(
    path: Path,
    series: Sequence[Series],
    *,
    title: str,
    ylabel: str,
    xlabel: str = "iteration",
    logy: bool = False,
    ylim: tuple[float, float] | None = None,
    markers: bool = True,
    legend_size: float | None = None,
    figsize: tuple[float, float] = (6, 4),
) -> None:
    """Draw ``series`` into one axes and write it to ``path`` (PNG, 100 dpi)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    for label, xs, ys in series:
        if markers:
            ax.plot(xs, ys, "o-", ms=3, label=label)
        else:
            ax.plot(xs, ys, label=label)
    if logy:
        ax.set_yscale("log")
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
