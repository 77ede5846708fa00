"""What the Lightning and Accelerate tests assert of the ranks' parameters after training."""

from __future__ import annotations

from typing import Any


def assert_gradzip_averages_were_applied(ranks: list[dict[str, Any]]) -> None:
    """Every rank trained, applied the same average as the others, and that average was
    gradzip's lossy one (DDP's exact all-reduce in the same processes trains otherwise)."""
    for rank in ranks:
        assert rank["gradzip"]["params"] != rank["initial"]  # it trained
    gradzip_params = [rank["gradzip"]["params"] for rank in ranks]
    plain_params = [rank["plain"]["params"] for rank in ranks]
    assert gradzip_params[0] == gradzip_params[1]  # every rank applied the same average
    assert plain_params[0] == plain_params[1]
    assert gradzip_params[0] != plain_params[0]
