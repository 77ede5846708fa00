"""Benchmarks that print figures (speed targets are checked here, never in timed tests)."""
