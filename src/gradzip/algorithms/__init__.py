"""Training algorithms built on the compressors and transports, one package per method:
:mod:`gradzip.algorithms.qesgd` (Quantized Epoch-SGD, spec 2), :mod:`gradzip.algorithms.svrg`
and :mod:`gradzip.algorithms.dqgan`.

Nothing is imported here on purpose: each algorithm is imported from its own package.
"""
