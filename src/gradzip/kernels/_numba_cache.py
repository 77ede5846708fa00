"""Dropping numba's cached machine code for this package when any of its sources changed.

numba's ``cache=True`` keys each cached function on the content of the file that defines it
only. A kernel that calls (and inlines) a function of another module keeps its old machine code
after that other module is edited: edit :mod:`~gradzip.kernels.philox` alone and the cached
kernels of :mod:`~gradzip.kernels.dithered` would still draw the old stream. So, before any
kernel module is imported, :func:`drop_stale_cache` compares a SHA-256 of every ``*.py`` source
of the package with the one stored beside the cache (file :data:`STAMP`) and, when they differ,
removes the cached ``<module>.*.nbi`` / ``<module>.*.nbc`` files of the package's modules, then
stores the new digest. numba then compiles again (once) and caches the new code.

[CHOICE] The cache directory is the one numba itself picks for the package's files, in numba's
order: ``NUMBA_CACHE_DIR`` when set, else the package's ``__pycache__`` when writable, else the
user-wide cache directory (a read-only install). When none can be written, numba caches nothing
there and nothing is done. A failure here never stops the import: it only warns.
Concurrent processes are safe: at worst two of them both drop the files and both compile.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

#: the file beside numba's cache holding the digest of the sources its entries were built from
STAMP = "gradzip-kernels.sources.sha256"


def source_digest(package_dir: Path) -> str:
    """SHA-256 (hex) over the names and bytes of the ``*.py`` files of ``package_dir``."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.glob("*.py")):
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def drop_stale_cache(package_dir: Path, cache_dir: Path) -> list[Path]:
    """Remove from ``cache_dir`` the numba cache files of ``package_dir``'s modules unless the
    digest stored in ``cache_dir / STAMP`` matches the sources; store the current digest.
    Returns the files removed."""
    digest = source_digest(package_dir)
    stamp = cache_dir / STAMP
    try:
        if stamp.read_text().strip() == digest:
            return []
    except OSError:
        pass
    removed = []
    for module in sorted(p.stem for p in package_dir.glob("*.py")):
        for pattern in (f"{module}.*.nbi", f"{module}.*.nbc"):
            for path in cache_dir.glob(pattern):
                try:
                    path.unlink()
                except FileNotFoundError:  # another process removed it first
                    continue
                removed.append(path)
    # write-then-rename: a reader never sees half a digest
    partial = cache_dir / f"{STAMP}.{os.getpid()}.tmp"
    partial.write_text(digest + "\n")
    os.replace(partial, stamp)
    return removed


def _locator_probe() -> None:
    """A function defined in this package's directory: numba's locators place its cache where
    they place every kernel's of this package."""


def numba_cache_dir(package_dir: Path) -> Path | None:
    """The directory numba caches this package's kernels in (created if needed), or None when
    numba finds none it can write."""
    from numba.core import caching

    default = [
        caching.UserProvidedCacheLocator,
        caching.InTreeCacheLocator,
        caching.UserWideCacheLocator,
    ]
    locators = getattr(getattr(caching, "_CacheImpl", None), "_locator_classes", default)
    source = str(package_dir / Path(__file__).name)
    for locator_class in locators:
        try:
            locator = locator_class.from_function(_locator_probe, source)
        except (NotImplementedError, OSError, RuntimeError):
            continue
        if locator is not None:
            return Path(locator.get_cache_path())
    return None


def drop_stale_package_cache() -> None:
    """:func:`drop_stale_cache` for this package in numba's cache directory; warns on failure."""
    package_dir = Path(__file__).resolve().parent
    try:
        cache_dir = numba_cache_dir(package_dir)
        if cache_dir is not None:
            drop_stale_cache(package_dir, cache_dir)
    except Exception as error:  # never block the import over the cache
        warnings.warn(
            f"gradzip could not check numba's kernel cache ({error!r}); after editing a kernel "
            "module, run with a fresh NUMBA_CACHE_DIR",
            RuntimeWarning,
            stacklevel=2,
        )
