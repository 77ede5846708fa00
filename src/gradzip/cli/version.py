"""``gradzip --version``: the installed package's version, read from its metadata only when
asked (nothing else is imported for it)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn


def package_version() -> str:
    """The version of the installed distribution; ``gradzip.__version__`` when the package is
    imported from a source tree without being installed."""
    from importlib import metadata

    try:
        return metadata.version("gradzip")
    except metadata.PackageNotFoundError:
        import gradzip

        return gradzip.__version__


class VersionAction(argparse.Action):
    """Print ``gradzip VERSION`` and exit 0 (argparse's own version action needs the version
    string when the parser is built, that is, on every command)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kw: Any):
        kw.setdefault("help", "print the installed gradzip version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> NoReturn:
        print(f"gradzip {package_version()}")  # on standard output, as argparse's own
        parser.exit(0)
