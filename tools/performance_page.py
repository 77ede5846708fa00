"""The generated tables of ``docs/performance.md`` and the README's summary, from stored results.

Every measured figure of the performance page sits between marker comments and is rewritten from
the result files ``gradzip bench cluster --json`` wrote, stored under ``benchmarks/results/``;
the prose around them is written by hand and never touched::

    <!-- performance:cluster-default-p2 -->
    ...the table of benchmarks/results/cluster-default-p2.json, then its command and machine...
    <!-- /performance -->

``<!-- performance:NAME:per-coordinate -->`` renders only the hook's cost per coordinate at no
limit (a rates table shows it below itself where the result has the no-limit rate),
``<!-- performance:summary -->`` the headline rows (the README holds the same block), and
``<!-- performance:others -->`` every stored result that has no block of its own: a new run
needs only its file under ``benchmarks/results/`` (its JSON records its command and machine),
then ``make performance-docs``.
Derived figures (ratios, the share of a byte reduction turned into speed, nanoseconds a
coordinate) are computed here from the stored rows. Headline comparisons use the isolated rows
(each variant in rank processes of its own, as a user runs it); interleaved figures appear only
where a ``--mode both`` result holds them beside the isolated ones, and are labelled.

The command and the machine of each run: the file's own ``command`` and ``machine`` (recorded by
``gradzip bench cluster`` since they were added), else ``benchmarks/results/manifest.json``.

Usage (``make performance-docs`` runs the first)::

    python tools/performance_page.py            # rewrite the marked blocks
    python tools/performance_page.py --check    # exit 1 if a page is stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path("benchmarks/results")
PAGES = (Path("docs/performance.md"), Path("README.md"))
# parameters of the benchmark models: mlp-4096 is 784-4096-4096-4096-10 (Dryden et al.'s MLP)
MODEL_NUMEL = {
    "mlp-4096": 784 * 4096 + 4096 + 2 * (4096 * 4096 + 4096) + 4096 * 10 + 10,
    "fc-300-100": 784 * 300 + 300 + 300 * 100 + 100 + 100 * 10 + 10,
}
ISOLATED, INTERLEAVED = "isolated", "interleaved"
RATES = {"100mbit": "100 Mbit/s", "1gbit": "1 Gbit/s", "none": "no limit"}
#: [CHOICE] results stored before the one grammar of exchange names (issue 27) spell some
#: variants the old way; they are read under today's spelling (the same configuration)
RENAMED = {
    "gradzip:dqsg:allgather": "gradzip:dqsg[M=2]:allgather",
    "gradzip:topk+ef:allgather": "gradzip:topk[ratio=0.01]+ef:allgather",
    "gradzip:topk-rice-qsgd+ef:allgather": (
        "gradzip:topk[ratio=0.01,index_coding=rice,value_codec=qsgd]+ef:allgather"
    ),
    "gradzip:topk0.1%-rice-qsgd+ef:allgather": (
        "gradzip:topk[ratio=0.001,index_coding=rice,value_codec=qsgd]+ef:allgather"
    ),
}
LABELS = {
    "none": "no communication",
    "fp32": "fp32 (plain DDP)",
    "fp16_hook": "`fp16_compress_hook`",
    "powersgd_r1": "torch PowerSGD rank 1",
    "powersgd_r4": "torch PowerSGD rank 4",
    "gradzip:dqsg[M=2]:allgather": "gradzip dqsg M=2, allgather",
    "gradzip:ndqsg:nested[allgather]": "gradzip ndqsg, nested[allgather]",
    "gradzip:qsgd:allgather": "gradzip qsgd, allgather",
    "gradzip:terngrad:allgather": "gradzip terngrad, allgather",
    "gradzip:onebit+ef:allgather": "gradzip onebit + EF, allgather",
    "gradzip:topk[ratio=0.01]+ef:allgather": "gradzip top-k 1% + EF, allgather",
    RENAMED["gradzip:topk-rice-qsgd+ef:allgather"]: "gradzip top-k 1% Rice + QSGD + EF, allgather",
    RENAMED["gradzip:topk0.1%-rice-qsgd+ef:allgather"]: (
        "gradzip top-k 0.1% Rice + QSGD + EF, allgather"
    ),
    "gradzip:fp16+ef:powersgd[r1,start2]": "**gradzip PowerSGD rank 1, fp16 factors**",
    "gradzip:fp16+ef:powersgd[r1]": "**gradzip PowerSGD rank 1, fp16 factors**",
    "gradzip:bf16+ef:powersgd[r1,start2]": "**gradzip PowerSGD rank 1, bf16 factors**",
    "gradzip:identity+ef:powersgd[r1,start2]": "**gradzip PowerSGD rank 1, float32 factors**",
}
SHORT = {"fp32": "fp32", "powersgd_r1": "torch PowerSGD"}
GRADZIP_POWERSGD = (
    "gradzip:bf16+ef:powersgd[r1,start2]",
    "gradzip:fp16+ef:powersgd[r1,start2]",
    "gradzip:fp16+ef:powersgd[r1]",
)
_BLOCK = re.compile(
    r"(?P<open><!-- performance:(?P<name>[a-z0-9-]+)(?::(?P<view>[a-z0-9-]+))? -->\n)"
    r"(?P<body>.*?)"
    r"(?P<close><!-- /performance -->)",
    re.DOTALL,
)

Result = dict[str, Any]


def label(variant: str) -> str:
    return LABELS.get(variant, f"`{variant}`")


def ms(value: float) -> str:
    return f"{value:,.0f}"


def mb(value: float) -> str:
    megabytes = value / 1e6
    return "0" if megabytes < 0.001 else f"{megabytes:.3g}"


def ratio(value: float) -> str:
    return f"{value:.2f}"


def load(name: str, results: Path) -> Result | None:
    """The stored result ``name`` (``results/<name>.json``), or None where it is not stored."""
    path = results / f"{name}.json"
    if not path.exists():
        return None
    result: Result = json.loads(path.read_text())
    for row in result["runs"]:
        row["variant"] = RENAMED.get(row["variant"], row["variant"])
    return result


def rows_of(result: Result, mode: str = ISOLATED) -> list[Result]:
    return [r for r in result["runs"] if r["mode"] == mode]


def find(result: Result | None, variant: str, rate: str, mode: str = ISOLATED) -> Result | None:
    if result is None:
        return None
    for row in rows_of(result, mode):
        if row["variant"] == variant and row["rate"] == rate:
            return row
    return None


def rates_of(result: Result) -> list[str]:
    return list(dict.fromkeys(r["rate"] for r in result["runs"]))


def variants_of(result: Result, mode: str = ISOLATED) -> list[str]:
    return list(dict.fromkeys(r["variant"] for r in rows_of(result, mode)))


def provenance(name: str, result: Result, results: Path) -> str:
    """One line: the stored file, its command, the machine, the date and how quiet it was."""
    manifest = json.loads((results / "manifest.json").read_text())
    entry = manifest["files"].get(f"{name}.json", {})
    command = result.get("command", entry.get("command", "not recorded"))
    machine = result.get("machine")
    if isinstance(machine, dict):
        where = (
            f"{machine.get('cpu_count')} CPUs, {machine.get('cpu')}, torch {machine.get('torch')}"
        )
        date = str(machine.get("date", ""))[:10]
    else:
        where = manifest["machines"].get(entry.get("machine", ""), "not recorded")
        date = entry.get("date", "not recorded")
    load_note = entry.get("load")
    runs = result["runs"]
    worlds = sorted({r["world_size"] for r in runs})
    models = sorted({r["model"] for r in runs})
    steps = f"{result.get('warmup')} warm-up and {result.get('steps')} timed steps"
    if "target_loss" in result:
        steps = f"{result.get('warmup')} warm-up steps, then at most {result.get('steps')}"
    rounds = result.get("rounds", 1)
    facts = [
        f"P = {', '.join(map(str, worlds))}",
        ", ".join(models) + f", batch {result.get('batch')} per rank",
        steps,
        f"{rounds} round{'s' if rounds != 1 else ''}",
    ]
    return (
        f"*Stored in `{RESULTS / (name + '.json')}`, written by `{command}` "
        f"({'; '.join(facts)}). Machine: {where}; {date}"
        + (f"; {load_note}" if load_note else "")
        + ".*"
    )


def rounds_range(row: Result) -> str:
    rounds = row.get("step_ms_rounds") or []
    if len(rounds) < 2:
        return ""
    return f" [{ms(min(rounds))}-{ms(max(rounds))}]"


def table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def render_rates(result: Result, mode: str = ISOLATED) -> str:
    """The rows of ``mode`` (isolated, or interleaved for a file that ran only those): ms a step
    and MB a rank and step per rate, the speed-up over the baseline and, at the first limited
    rate, the byte reduction and the share of it turned into speed."""
    baseline = result.get("baseline") or "fp32"
    rates = rates_of(result)
    limited = next((r for r in rates if r != "none"), None)
    savings = limited if baseline == "fp32" else None  # bytes and their share against fp32 only
    short = SHORT.get(baseline, baseline)
    header = ["variant"]
    for rate in rates:
        header += [
            f"{RATES.get(rate, rate)}: ms / MB"
            if rate == limited
            else f"{RATES.get(rate, rate)}: ms"
        ]
        if rate != "none":
            header.append(f"× {short}")
    if savings:
        header += [f"bytes: × fewer than {short}", "speed-up / byte reduction"]
    body = []
    for variant in variants_of(result, mode):
        cells = [label(variant)]
        for rate in rates:
            row, base = find(result, variant, rate, mode), find(result, baseline, rate, mode)
            if row is None:
                cells += ["—"] + ([] if rate == "none" else ["—"])
                continue
            text = ms(row["step_ms"])
            if rate == limited:
                text += f" / {mb(row['bytes_sent_per_rank'])}"
            cells.append(text)
            if rate != "none":
                shown = variant != "none" and base is not None
                cells.append(ratio(base["step_ms"] / row["step_ms"]) if base and shown else "")
        if savings:
            row, base = find(result, variant, savings, mode), find(result, baseline, savings, mode)
            if row is None or base is None or variant in ("none", baseline):
                cells += ["", ""]
            else:
                bytes_x = base["bytes_sent_per_rank"] / row["bytes_sent_per_rank"]
                speed_x = base["step_ms"] / row["step_ms"]
                share = f"{100 * speed_x / bytes_x:.0f}%" if bytes_x > 1 else ""
                cells += [f"{bytes_x:,.1f}", share]
        body.append(cells)
    return table(header, body)


def mode_of(result: Result) -> str:
    """The rows a file's tables show: its isolated ones, or its interleaved ones where it ran
    only those (``--mode interleaved``: every variant step by step in the same processes)."""
    return INTERLEAVED if result.get("mode") == INTERLEAVED else ISOLATED


def render_both(result: Result) -> str:
    """A ``--mode both`` result: per rate the isolated figure (the rounds' medians in brackets)
    and its ratio to the baseline, the interleaved one beside it, labelled; MB and the loss."""
    baseline = result.get("baseline") or "powersgd_r1"
    rates = rates_of(result)
    header = ["variant"]
    for rate in rates:
        name = RATES.get(rate, rate)
        header += [f"{name}: ms, isolated", "× torch" if "powersgd" in baseline else "×"]
        header += [f"{name}: ms, interleaved", "×"]
    header += ["MB a rank and step", "loss after the timed steps"]
    body = []
    for variant in variants_of(result):
        cells = [label(variant)]
        for rate in rates:
            for mode in (ISOLATED, INTERLEAVED):
                row, base = find(result, variant, rate, mode), find(result, baseline, rate, mode)
                if row is None or base is None:
                    cells += ["—", "—"]
                    continue
                ranges = rounds_range(row) if mode == ISOLATED else ""
                cells += [ms(row["step_ms"]) + ranges, ratio(base["step_ms"] / row["step_ms"])]
        first = find(result, variant, rates[0])
        assert first is not None
        cells += [mb(first["bytes_sent_per_rank"]), f"{first['loss_last']:.3f}"]
        body.append(cells)
    return table(header, body)


def render_target(result: Result) -> str:
    """A time-to-target result: steps and seconds to the target loss, isolated (and interleaved
    where the result holds it), each against the baseline."""
    baseline = result.get("baseline") or "powersgd_r1"
    rate = rates_of(result)[0]
    both = any(r["mode"] == INTERLEAVED for r in result["runs"])
    header = ["variant", "steps", "seconds, isolated", "× sooner than torch"]
    if both:
        header += ["seconds, interleaved", "×"]
    body = []
    for variant in variants_of(result):
        cells = [label(variant)]
        for mode in (ISOLATED, INTERLEAVED) if both else (ISOLATED,):
            row, base = find(result, variant, rate, mode), find(result, baseline, rate, mode)
            assert row is not None and base is not None
            seconds = row["time_to_target_s"]
            if mode == ISOLATED:
                cells.append(
                    str(row["steps_to_target"]) if row["steps_to_target"] else "not reached"
                )
            cells += [f"{seconds:,.1f}", ratio(base["time_to_target_s"] / seconds)]
        body.append(cells)
    return table(header, body)


def render_per_coordinate(result: Result) -> str:
    """At no limit: each variant's step, its time over the step without communication, and
    that time per coordinate of the model (ns)."""
    rows = [r for r in rows_of(result) if r["rate"] == "none"]
    body = []
    for row in rows:
        none = find(result, "none", "none")
        assert none is not None
        extra = row["step_ms"] - none["step_ms"]
        numel = MODEL_NUMEL[row["model"]]
        cells = [label(row["variant"]), ms(row["step_ms"])]
        cells += ["", ""] if row["variant"] == "none" else [ms(extra), f"{extra * 1e6 / numel:.1f}"]
        body.append(cells)
    header = ["variant", "ms a step, no limit", "ms over no communication", "ns a coordinate"]
    return table(header, body)


def at_world_size(result: Result, world_size: int) -> Result:
    """``result`` with only its rows at ``world_size`` ranks."""
    return {**result, "runs": [r for r in result["runs"] if r["world_size"] == world_size]}


def _cell(found: list[Result | None], text: Callable[..., str]) -> str:
    return "not measured" if any(r is None for r in found) else text(*found)


def gradzip_powersgd(result: Result | None) -> Result | None:
    """gradzip's PowerSGD row at 100 Mbit/s, under whichever of its spellings the run used."""
    rows = (find(result, variant, "100mbit") for variant in GRADZIP_POWERSGD)
    return next((row for row in rows if row is not None), None)


def render_summary(results: Path) -> str:
    """The headline rows, every one from isolated runs, at P = 2 and P = 4."""
    files: dict[str, Result | None] = {
        name: load(name, results)
        for name in (
            "cluster-powersgd-p2-p4-fused", "cluster-default-p2",
            "cluster-default-p4", "cluster-time-to-target-p2", "cluster-time-to-target-p4",
        )
    }  # fmt: skip

    def powersgd(name: str, world_size: int) -> str:
        stored = files[name]
        result = None if stored is None else at_world_size(stored, world_size)
        gz = gradzip_powersgd(result)
        return _cell(
            [gz, find(result, "powersgd_r1", "100mbit")],
            lambda g, t: (
                f"{ms(g['step_ms'])} against {ms(t['step_ms'])} ms: "
                f"**{ratio(t['step_ms'] / g['step_ms'])}×** faster, "
                f"{ratio(g['bytes_sent_per_rank'] / t['bytes_sent_per_rank'])}× the bytes"
            ),
        )

    def baselines(name: str) -> str:
        result = files[name]
        return _cell(
            [find(result, "fp32", "100mbit"), find(result, "fp16_hook", "100mbit")],
            lambda a, b: f"{ms(a['step_ms'])} / {ms(b['step_ms'])} ms",
        )

    def shares(name: str) -> str:
        result = files[name]
        variants = (
            "gradzip:dqsg[M=2]:allgather",
            "gradzip:qsgd:allgather",
            "gradzip:terngrad:allgather",
        )
        found = [find(result, "fp32", "100mbit")] + [find(result, v, "100mbit") for v in variants]

        def text(fp32: Result, *rows: Result) -> str:
            parts = []
            for row in rows:
                speed = fp32["step_ms"] / row["step_ms"]
                fewer = fp32["bytes_sent_per_rank"] / row["bytes_sent_per_rank"]
                parts.append(f"{100 * speed / fewer:.0f}%")
            return " / ".join(parts)

        return _cell(found, text)

    def target(name: str) -> str:
        result = files[name]
        gz = gradzip_powersgd(result)
        return _cell(
            [gz, find(result, "powersgd_r1", "100mbit")],
            lambda g, t: (
                f"{g['time_to_target_s']:.1f} against {t['time_to_target_s']:.1f} s: "
                f"**{ratio(t['time_to_target_s'] / g['time_to_target_s'])}×** sooner"
            ),
        )

    rows = [
        ["step at 100 Mbit/s: gradzip's PowerSGD (rank 1, bf16 factors, EF) against PyTorch's "
         "`powerSGD_hook` (rank 1)", powersgd("cluster-powersgd-p2-p4-fused", 2),
         powersgd("cluster-powersgd-p2-p4-fused", 4), "`cluster-powersgd-p2-p4-fused`"],
        ["step at 100 Mbit/s: fp32 DDP / `fp16_compress_hook`", baselines("cluster-default-p2"),
         baselines("cluster-default-p4"), "`cluster-default-p2`, `-p4`"],
        ["share of the byte reduction over fp32 turned into speed at 100 Mbit/s: dqsg / qsgd / "
         "terngrad (allgather)", shares("cluster-default-p2"), shares("cluster-default-p4"),
         "`cluster-default-p2`, `-p4`"],
        ["time to a training loss of 0.4 at 100 Mbit/s: gradzip's PowerSGD against PyTorch's",
         target("cluster-time-to-target-p2"), target("cluster-time-to-target-p4"),
         "`cluster-time-to-target-p2`, `-p4`"],
    ]  # fmt: skip
    header = ["each variant in rank processes of its own", "P = 2", "P = 4", "stored result"]
    note = (
        "*mlp-4096 (36.8M parameters) on MNIST, gloo DDP on an emulated network, a 2-core "
        "development VM (no GPU; each stored result names its CPU on the performance page); ms: "
        "the slowest rank's step, median of the timed steps. "
        "Generated from `benchmarks/results/` by `make performance-docs`.*"
    )
    return table(header, rows) + "\n\n" + note


def render_block(name: str, view: str | None, results: Path) -> str:
    """The Markdown between the markers ``<!-- performance:NAME[:VIEW] -->``."""
    if name == "summary":
        return render_summary(results) + "\n"
    if name == "others":
        raise SystemExit("performance_page: the others block is rendered by render_page")
    result = load(name, results)
    if result is None:
        raise SystemExit(f"performance_page: {results / (name + '.json')} is not stored")
    if view is not None and re.fullmatch(r"p[0-9]+", view):
        # one world size of a file that ran several (``--world-sizes 2,4``)
        result = at_world_size(result, int(view[1:]))
        if not result["runs"]:
            raise SystemExit(f"performance_page: {name} has no rows at {view}")
        view = None
    if view == "per-coordinate":
        body = render_per_coordinate(result)
    elif view is not None:
        raise SystemExit(f"performance_page: unknown view {view!r} for {name}")
    elif "target_loss" in result:
        body = render_target(result)
    elif result.get("mode") == "both":
        body = render_both(result)
    elif len({r["world_size"] for r in result["runs"]}) > 1:
        # a file of several world sizes: a table each (``find`` would mix them)
        body = "\n\n".join(
            f"P = {p}:\n\n" + render_rates(at_world_size(result, p), mode_of(result))
            for p in sorted({r["world_size"] for r in result["runs"]})
        )
    else:
        body = render_rates(result, mode_of(result))
        if find(result, "none", "none") is not None:  # the hook's cost where the wire is free
            body += "\n\nAt no limit, per coordinate of the model:\n\n" + render_per_coordinate(
                result
            )
    return body + "\n\n" + provenance(name, result, results) + "\n"


def stored(results: Path) -> list[str]:
    """The names of every stored result: the manifest's files and any other ``*.json``."""
    manifest = json.loads((results / "manifest.json").read_text())
    names = [Path(name).stem for name in manifest["files"]]
    names += [path.stem for path in sorted(results.glob("*.json")) if path.name != "manifest.json"]
    return [name for name in dict.fromkeys(names) if (results / f"{name}.json").exists()]


def render_others(text: str, results: Path) -> str:
    """Every stored result without a marker block of its own on the page, one after another, so
    that a new run needs only its file (and, for an old file, a manifest entry)."""
    placed = {match["name"] for match in _BLOCK.finditer(text)}
    parts = []
    for name in stored(results):
        if name not in placed:
            parts.append(f"### `{name}`\n\n" + render_block(name, None, results))
    return "\n".join(parts) if parts else "*Every stored result has its own section above.*\n"


def render_page(text: str, results: Path) -> str:
    """``text`` with every marked block regenerated (prose untouched)."""

    def replace(match: re.Match[str]) -> str:
        if match["name"] == "others":
            block = render_others(text, results)
        else:
            block = render_block(match["name"], match["view"], results)
        return match["open"] + block + match["close"]

    return _BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    args = parser.parse_args(argv)
    stale = []
    for page in PAGES:
        path = ROOT / page
        text = path.read_text()
        new = render_page(text, ROOT / RESULTS)
        if new != text:
            stale.append(str(page))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run `make performance-docs`", file=sys.stderr)
        return 1
    print(("rewrote " if stale else "up to date: ") + ", ".join(stale or map(str, PAGES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
