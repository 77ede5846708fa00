"""The lab's subcommands of ``gradzip``: ``bench`` (:mod:`.bench`) and ``reproduce``
(:mod:`.reproduce`), each a function that adds its parser to the CLI's subparsers, found by
:mod:`gradzip.cli.commands` through the ``gradzip.commands`` entry points. Building them imports
nothing heavy (no torch): their options are checked before the benchmarks or experiments load.
"""
