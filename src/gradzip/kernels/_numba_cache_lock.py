"""One process at a time writes an entry of numba's on-disk cache for a given function.

numba (0.68) saves a new overload of a ``cache=True`` function in
``IndexDataCacheFile.save``: read the function's index (``*.nbi``), name the new machine-code
file by the first number the index does not use, write the index, then the data file
(``*.<n>.nbc``). Nothing holds off a second process between the read and the writes, so two
processes compiling *different* overloads of one kernel at once (the ranks of a gloo test,
the warm-up beside a test run) can both pick ``1``: the index that lands names one overload,
the data file that lands may hold the other's machine code, and every later process loads
code compiled for other argument types under that key (numba's loader does not check the
key stored in the data). The same family of race is numba issue 10128; its maintainers
proposed a file lock.

:func:`install_save_lock` replaces that method with one that does the same under an exclusive
``fcntl.flock`` on ``<index>.lock`` beside the index, re-reading the index inside the lock, and
writes the data file *before* the index so that a reader (numba loads without a lock) never
finds an index entry whose file is missing or still holds a stale stamp's code.

[CHOICE] POSIX only: where ``fcntl`` is missing (Windows) numba's own method stays. The patch is
applied once per process when :mod:`gradzip.kernels` is imported, before any kernel compiles;
if numba's private helpers are not where 0.68 has them, nothing is patched (numba's own method
stays) and a warning says so.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

#: the methods of numba's ``IndexDataCacheFile`` the locked ``save`` calls (and, set by its
#: ``__init__``, the attribute ``_index_path``)
_HELPERS = ("_load_index", "_save_index", "_save_data", "_data_name")


@contextlib.contextmanager
def exclusive_lock(path: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def locked_save(cache_file: Any, key: Any, data: Any) -> None:
    """numba's ``IndexDataCacheFile.save`` under a per-index file lock, data file first."""
    with exclusive_lock(cache_file._index_path + ".lock"):
        overloads = cache_file._load_index()
        data_name = overloads.get(key)
        new_entry = data_name is None
        if new_entry:
            taken = set(overloads.values())
            names = (cache_file._data_name(n) for n in itertools.count(1))
            data_name = next(name for name in names if name not in taken)
        cache_file._save_data(data_name, data)
        if new_entry:
            overloads[key] = data_name
            cache_file._save_index(overloads)


def install_save_lock() -> bool:
    """Patch numba's cache writer with :func:`locked_save`; True when it is (now or already)."""
    try:
        import fcntl  # noqa: F401  (POSIX only)
    except ImportError:
        return False
    from numba.core import caching

    cls = caching.IndexDataCacheFile
    if cls.save is locked_save:
        return True
    missing = [name for name in _HELPERS if not hasattr(cls, name)]
    if missing:
        warnings.warn(
            f"numba's IndexDataCacheFile lacks {missing}: gradzip could not serialise its cache "
            "writes; run one process at a time on a cold cache (python -m gradzip.warmup)",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    save: Callable[..., None] = locked_save
    cls.save = save  # type: ignore[method-assign]
    return True
