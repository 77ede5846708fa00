"""Fused compression kernels: numba kernels for CPU tensors, torch operations for the others.

Each ``*_torch`` module computes, with torch operations only, exactly the bytes and values of
its numba twin, so a payload encoded on a GPU decodes on a CPU and back.
"""
