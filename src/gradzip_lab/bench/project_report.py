"""The scaling model's outputs: the step-time table, the winner map and the speed-up figure."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gradzip_lab.bench.project_variants import Prediction

RATES_GBIT: tuple[float, ...] = (1, 10, 25, 100, 400)
WORLD_SIZES: tuple[int, ...] = tuple(2**i for i in range(1, 11))


def step_table(rows: Sequence[Prediction]) -> str:
    """One line per prediction: step ms, comm and codec ms, MB a rank sends, speed-up over fp32
    at the same P and rate."""
    fp32 = {(r.world_size, r.gbit_per_s): r.step_s for r in rows if r.variant == "fp32"}
    width = max([len(r.variant) for r in rows] + [7])
    lines = [
        f"{'P':>5} {'Gbit/s':>7} {'variant':<{width}} {'step ms':>10} {'comm ms':>10} "
        f"{'codec ms':>9} {'MB/rank':>9} {'vs fp32':>8}"
    ]
    for r in rows:
        base = fp32.get((r.world_size, r.gbit_per_s))
        speedup = f"{base / r.step_s:8.2f}" if base else f"{'-':>8}"
        lines.append(
            f"{r.world_size:>5} {r.gbit_per_s:>7g} {r.variant:<{width}} {1e3 * r.step_s:>10.1f} "
            f"{1e3 * r.comm_s:>10.1f} {1e3 * r.codec_s:>9.1f} {r.bytes_per_rank / 1e6:>9.3f} "
            f"{speedup}"
        )
    return "\n".join(lines)


def winners(rows: Sequence[Prediction]) -> dict[tuple[float, int], Prediction]:
    """The fastest prediction at each (rate, P)."""
    best: dict[tuple[float, int], Prediction] = {}
    for r in rows:
        key = (r.gbit_per_s, r.world_size)
        if key not in best or r.step_s < best[key].step_s:
            best[key] = r
    return best


def winner_map(rows: Sequence[Prediction]) -> str:
    """A table: one line per rate, one column per P, the winning variant's number (legend
    below) and its speed-up over fp32."""
    best = winners(rows)
    fp32 = {(r.gbit_per_s, r.world_size): r.step_s for r in rows if r.variant == "fp32"}
    names = sorted({w.variant for w in best.values()})
    sizes = sorted({p for _, p in best})
    rates = sorted({g for g, _ in best})
    lines = [f"{'Gbit/s':>7} " + " ".join(f"{'P=' + str(p):>10}" for p in sizes)]
    for rate in rates:
        cells = []
        for p in sizes:
            w = best[(rate, p)]
            base = fp32.get((rate, p))
            gain = f"x{base / w.step_s:.1f}" if base else ""
            cells.append(f"{'#' + str(names.index(w.variant) + 1) + ' ' + gain:>10}")
        lines.append(f"{rate:>7g} " + " ".join(cells))
    lines += [f"  #{i + 1}: {n}" for i, n in enumerate(names)]
    return "\n".join(lines)


def speedup_figure(rows: Sequence[Prediction], path: str | Path, title: str) -> None:
    """Predicted speed-up over fp32 against P (log-log), one line per variant, one panel per
    rate, to a PNG at ``path`` (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r.gbit_per_s for r in rows})
    variants = list(dict.fromkeys(r.variant for r in rows))
    fp32 = {(r.gbit_per_s, r.world_size): r.step_s for r in rows if r.variant == "fp32"}
    fig, axes = plt.subplots(1, len(rates), figsize=(4 * len(rates), 5.0), sharey=True)
    axes = list(axes) if len(rates) > 1 else [axes]
    colours = plt.get_cmap("tab20")
    for ax, rate in zip(axes, rates, strict=True):
        for i, v in enumerate(variants):
            points = sorted(
                (r.world_size, fp32[(rate, r.world_size)] / r.step_s)
                for r in rows
                if r.variant == v and r.gbit_per_s == rate and (rate, r.world_size) in fp32
            )
            if points:
                ax.plot(
                    *zip(*points, strict=True),
                    marker="o",
                    markersize=3,
                    color=colours(i % 20),
                    linestyle=("-", "--", ":")[i % 3],
                    label=v,
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title(f"{rate:g} Gbit/s")
        ax.set_xlabel("ranks P")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("predicted speed-up over fp32")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
