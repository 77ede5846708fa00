"""Aggregation schemes: how the ranks' payloads become one averaged tensor."""

from gradzip.schemes.allgather_decode import AllGatherDecode

__all__ = ["AllGatherDecode"]
