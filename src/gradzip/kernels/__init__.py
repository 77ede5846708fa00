"""Fused compression kernels: numba kernels for CPU tensors, torch operations for the others.

Each ``*_torch`` module computes, with torch operations only, exactly the bytes and values of
its numba twin, so a payload encoded on a GPU decodes on a CPU and back.

numba cache: numba's ``cache=True`` notices edits to a kernel's own file only, not to the
modules it calls into (a kernel of :mod:`.dithered` inlines :mod:`.philox`). Importing this
package therefore first drops numba's cached files of every module here when any source file
of the package changed since they were cached (:mod:`._numba_cache`): after an edit, the first
run compiles again instead of running stale machine code. It also serialises numba's writes of
a new cache entry across processes (:mod:`._numba_cache_lock`): numba alone can file one
overload's machine code under another's key when two processes compile one kernel at once.
"""

from gradzip.kernels._numba_cache import drop_stale_package_cache
from gradzip.kernels._numba_cache_lock import install_save_lock

install_save_lock()
drop_stale_package_cache()
