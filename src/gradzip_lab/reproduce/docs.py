"""The generated tables of ``docs/reproduction.md``, rewritten from stored ``result.json`` files.

The page's prose is written by hand; every figure a reproduction measured sits between marker
comments and is generated, so the docs cannot drift from the results::

    <!-- generated:dqsg-fig5:quick -->
    ...replaced by the comparison table of docs/results/dqsg-fig5-quick.json...
    <!-- /generated -->

``<!-- generated:dqsg-fig4:quick:accuracy -->`` renders the result's ``accuracy`` entry instead,
a nested mapping ``{table: {row: {column: value}}}`` (e.g. panel, method, worker count), as one
table per first-level key. ``<!-- generated:dqsg-fig5:quick-seeds -->`` renders a multi-seed
result (``gradzip reproduce ID --seeds N``, stored as ``<id>-quick-seeds.json``): every row's
mean ± sd and the paired tests of the methods.

The results live in the repository (``docs/results/<id>-<quick|full>[-seeds].json``, copies of what
``gradzip reproduce`` wrote), so regenerating is reproducible and a test can check that the page
matches them. Usage (``make reproduction-docs`` runs the second)::

    python -m gradzip_lab.reproduce.docs --collect OUT   # copy OUT/<id>/result.json in
    python -m gradzip_lab.reproduce.docs                 # rewrite the marked blocks
    python -m gradzip_lab.reproduce.docs --check         # exit 1 if the page is stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from gradzip_lab.reproduce.outcome import Row, format_rows, format_value
from gradzip_lab.reproduce.seeds import format_comparisons, format_seed_rows

DOC = Path("docs/reproduction.md")
RESULTS = Path("docs/results")
_BLOCK = re.compile(
    r"(?P<open><!-- generated:(?P<id>[a-z0-9-]+):(?P<mode>(?:quick|full)(?:-seeds)?)(?::(?P<entry>[a-z_]+))? -->\n)"
    r"(?P<body>.*?)"
    r"(?P<close><!-- /generated -->)",
    re.DOTALL,
)


def result_file(experiment_id: str, mode: str) -> str:
    """``<id>-<mode>.json`` (mode ``quick``, ``full``, ``quick-seeds`` or ``full-seeds``):
    where a result is stored under the results folder."""
    return f"{experiment_id}-{mode}.json"


def result_name(result: dict[str, Any]) -> str:
    """The stored name of ``result`` (its id and mode; ``-seeds`` for a multi-seed one)."""
    mode = ("quick" if result["quick"] else "full") + ("-seeds" if "seeds" in result else "")
    return result_file(result["id"], mode)


def render_seeded(result: dict[str, Any], source: str) -> str:
    """The Markdown of one multi-seed result: mean ± sd per row, then the paired tests."""
    seeds = result["seeds"]
    parts = [format_seed_rows(result["rows"])]
    if result["comparisons"]:
        parts += [
            f'Method comparisons, paired t-test over {len(seeds)} seeds (see "Seeds and noise"'
            " above):",
            format_comparisons(result["comparisons"]),
        ]
    quick = " --quick" if result["quick"] else ""
    parts.append(
        f"*Generated from `{source}` (`gradzip reproduce {result['id']}{quick} --seeds "
        f"{len(seeds)}`, seeds {', '.join(map(str, seeds))}, {result['seconds']:.0f} s in all).*"
    )
    return "\n\n".join(parts) + "\n"


def render_result(result: dict[str, Any], source: str) -> str:
    """The Markdown of one result: its comparison table (derived paper values footnoted) and
    where it came from."""
    rows = [
        Row(
            r["quantity"],
            r["paper"],
            r["ours"],
            r.get("unit", ""),
            r.get("paper_derived", ""),
        )
        for r in result["rows"]
    ]
    mode = "--quick" if result["quick"] else "full"
    return (
        f"{format_rows(rows)}\n\n"
        f"*Generated from `{source}` (`gradzip reproduce {result['id']}"
        f"{' --quick' if result['quick'] else ''}`, {mode} mode, "
        f"{result['seconds']:.0f} s).*\n"
    )


def _column_order(key: str) -> tuple[int, float | str]:
    """Numeric column names (worker counts) in numeric order, before any others."""
    try:
        return (0, float(key))
    except ValueError:
        return (1, key)


def render_grid(grid: dict[str, dict[str, dict[str, float | None]]], source: str) -> str:
    """``{table: {row: {column: value}}}`` as one Markdown table per table; ``source`` is
    Markdown naming where the figures come from."""
    parts = []
    for name, table in grid.items():
        columns = sorted({c for row in table.values() for c in row}, key=_column_order)
        lines = [
            f"| {name} | {' | '.join(columns)} |",
            "|---|" + "---:|" * len(columns),
        ]
        for row, values in table.items():
            cells = " | ".join(format_value(values.get(c)) for c in columns)
            lines.append(f"| {row} | {cells} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + f"\n\n*Generated from {source}.*\n"


def generate(text: str, results: Path) -> str:
    """``text`` with every marked block rewritten from ``results/<id>-<mode>.json``; a marker
    whose file is missing raises ``FileNotFoundError`` naming it."""

    def replace(m: re.Match[str]) -> str:
        path = results / result_file(m["id"], m["mode"])
        if not path.is_file():
            raise FileNotFoundError(f"{path} (needed by the marker {m['open'].strip()})")
        result = json.loads(path.read_text())
        source = f"{results.name}/{path.name}"
        if "seeds" in result:
            body = render_seeded(result, source)
        elif m["entry"]:
            body = render_grid(result[m["entry"]], f"`{source}`, entry `{m['entry']}`")
        else:
            body = render_result(result, source)
        return f"{m['open']}{body}{m['close']}"

    return _BLOCK.sub(replace, text)


#: a parenthesised absolute path, e.g. where a data set was read from
_LOCAL_PATH = re.compile(r"\s*\((?:/|[A-Za-z]:\\)[^()]*\)")
#: a bare absolute path of two or more parts after a space (``in /data/fmnist.``)
_BARE_PATH = re.compile(r"(?<=\s)/[\w.-]*\w(?:/[\w.-]*\w)+")


def portable(value: Any) -> Any:
    """``value`` without what only holds on the machine that ran it: ``run_dir`` entries,
    parenthesised absolute paths inside strings, and bare ones named ``<local directory>`` (the
    results are committed to the repository)."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items() if k != "run_dir"}
    if isinstance(value, list):
        return [portable(v) for v in value]
    if isinstance(value, str):
        return _BARE_PATH.sub("<local directory>", _LOCAL_PATH.sub("", value))
    return value


def collect(out: Path, results: Path) -> list[Path]:
    """Copy every ``out/<id>/result.json`` to ``results/<id>-<mode>.json`` (made
    :func:`portable`); the copies."""
    results.mkdir(parents=True, exist_ok=True)
    copied = []
    for source in sorted(out.glob("*/result.json")):
        result = portable(json.loads(source.read_text()))
        target = results / result_name(result)
        target.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        copied.append(target)
    return copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gradzip_lab.reproduce.docs",
        description="Rewrite the generated tables of the reproduction page from stored results.",
    )
    parser.add_argument("--doc", type=Path, default=DOC, help=f"the page (default {DOC})")
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"default {RESULTS}")
    parser.add_argument(
        "--collect", type=Path, metavar="OUT", help="first copy OUT/<id>/result.json in"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    if args.collect is not None:
        for path in collect(args.collect, args.results):
            print(f"collected {path}")
    text = args.doc.read_text()
    try:
        fresh = generate(text, args.results)
    except FileNotFoundError as err:
        print(f"missing result: {err}", file=sys.stderr)
        return 1
    if args.check:
        if fresh != text:
            print(f"{args.doc} is stale: run python -m gradzip_lab.reproduce.docs")
            return 1
        return 0
    if fresh != text:
        args.doc.write_text(fresh)
        print(f"rewrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
