"""The paper lab: the reproductions of the seed papers' tables and figures
(:mod:`gradzip_lab.reproduce`, ``gradzip reproduce``) and the benchmarks
(:mod:`gradzip_lab.bench`, ``gradzip bench``), built on the gradzip library.

It is installed from this repository beside the library and adds its two subcommands to the
``gradzip`` command line through the ``gradzip.commands`` entry points (pyproject.toml;
:mod:`gradzip.cli.commands`). The lab imports the library; the library never imports the lab
(``tests/test_architecture.py``).
"""
