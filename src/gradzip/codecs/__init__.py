"""Entropy-free and entropy codecs that turn integer symbol streams into bytes."""
