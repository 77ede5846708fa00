"""Training algorithms built on the compressors and transports: one module (or a few ``<name>_*``
modules) per method, e.g. :mod:`gradzip.algorithms.qesgd` (Quantized Epoch-SGD, spec 2).

Nothing is imported here on purpose: each algorithm is imported from its own module.
"""
