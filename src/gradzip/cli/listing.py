"""``gradzip list [compressors|experiments|models|schemes]``: what the library offers."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any


def add_list_parser(sub: Any, run_command: Callable[[Sequence[str]], int]) -> None:
    """Register ``gradzip list`` on the CLI's subparsers; ``run_command`` runs another gradzip
    command line (``gradzip list experiments`` is ``gradzip reproduce --list``)."""
    p_list = sub.add_parser(
        "list", help="list the compressors (default), experiments, models or schemes"
    )
    p_list.add_argument(
        "what",
        nargs="?",
        default="compressors",
        choices=("compressors", "experiments", "models", "schemes"),
        help="what to list (default: compressors)",
    )
    p_list.add_argument("-v", "--verbose", action="store_true", help="show ids and example configs")
    p_list.set_defaults(func=cmd_list, run_command=run_command)


def cmd_list(args: argparse.Namespace) -> int:
    if args.what == "experiments":
        # the paper lab's experiments: its `gradzip reproduce --list` (or its one line when the
        # lab is not installed), reached through the command line, never by importing the lab
        run: Callable[[Sequence[str]], int] = args.run_command
        return run(["reproduce", "--list"])
    if args.what == "models":
        from gradzip.models.paper import MODELS, model_info

        width = max(len(m) for m in MODELS)
        for model in MODELS:
            info = model_info(model)
            count = sum(p.numel() for p in info.factory(0.0).parameters())
            shape = "x".join(map(str, info.input_shape))
            print(f"{model:<{width}}  {info.dataset}, input {shape}, {count:,} parameters")
        return 0
    if args.what == "schemes":
        from gradzip.schemes import VARIANTS

        for variant in VARIANTS:
            print(variant)
        return 0
    from gradzip.compressors import get, names
    from gradzip.compressors.registry import summary

    width = max(len(n) for n in names())
    for name in names():
        cls = get(name)
        print(f"{name:<{width}}  {summary(cls)}")
        if args.verbose:
            print(
                f"{'':<{width}}  codec id {cls.codec_id}; example: {cls(**cls.example_params).describe()}"
            )
    return 0
