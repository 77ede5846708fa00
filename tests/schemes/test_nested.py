"""The nested scheme's default P1 compressor follows the NDQSG compressor's seed schedule."""

from __future__ import annotations

from gradzip.compressors.ndqsg import NDQSG
from gradzip.schemes.nested import NestedScheme


def test_default_coarse_follows_a_chained_seed_schedule() -> None:
    chained = NestedScheme(NDQSG(seed_schedule="chain", chain_draws=123))
    assert chained.coarse.wire_params()["seed_schedule"] == "chain"
    assert chained.coarse.wire_params()["chain_draws"] == 123
    assert "seed_schedule" not in NestedScheme(NDQSG()).coarse.wire_params()
