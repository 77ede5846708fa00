"""The command line's light copies of the registries' names (gradzip.cli.catalog) equal the
registries: a name added to a registry and not to the catalog would be refused."""

from __future__ import annotations

from gradzip.cli import catalog


def test_the_catalog_names_what_the_registries_hold() -> None:
    import gradzip
    from gradzip.experiments.methods import METHODS
    from gradzip.models.paper import MODELS
    from gradzip.schemes import SCHEMES, VARIANTS

    assert tuple(gradzip.names()) == catalog.COMPRESSORS
    assert tuple(VARIANTS) == catalog.SCHEME_VARIANTS
    assert tuple(SCHEMES) == catalog.SCHEMES
    assert tuple(MODELS) == catalog.MODELS
    assert tuple(METHODS) == catalog.METHODS
