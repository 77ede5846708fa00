"""Experiment descriptions of the seed papers (model shapes, settings) used by tables and runs."""
