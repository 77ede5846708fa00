"""The kernels package drops numba's cached code when any of its sources changes (numba's own
check covers a kernel's own file only, not the modules it calls into)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gradzip.kernels import _numba_cache
from gradzip.kernels._numba_cache import STAMP, drop_stale_cache, source_digest


def _package(root: Path) -> Path:
    package = root / "pkg"
    package.mkdir()
    (package / "alpha.py").write_text("A = 1\n")
    (package / "beta.py").write_text("B = 2\n")
    return package


def test_digest_follows_every_source_file(tmp_path: Path) -> None:
    package = _package(tmp_path)
    first = source_digest(package)
    (package / "beta.py").write_text("B = 3\n")
    second = source_digest(package)
    (package / "gamma.py").write_text("")
    assert len({first, second, source_digest(package)}) == 3


def test_stale_entries_of_the_package_only_are_removed(tmp_path: Path) -> None:
    package = _package(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    ours = ["alpha.kernel-12.py311.nbi", "alpha.kernel-12.py311.0.nbc", "beta.f-3.py311.nbi"]
    others = ["alpha_torch.g-1.py311.nbi", "other.h-2.py311.nbc", "alpha.cpython-311.pyc"]
    for name in ours + others:
        (cache / name).write_bytes(b"x")
    removed = drop_stale_cache(package, cache)  # no stamp yet: everything of ours is stale
    assert sorted(p.name for p in removed) == sorted(ours)
    assert sorted(p.name for p in cache.iterdir()) == sorted([*others, STAMP])
    assert (cache / STAMP).read_text().strip() == source_digest(package)
    (cache / ours[0]).write_bytes(b"x")  # cached again from the same sources: kept
    assert drop_stale_cache(package, cache) == []
    assert (cache / ours[0]).exists()
    (package / "beta.py").write_text("B = 4\n")  # an edit to the other module: dropped
    assert [p.name for p in drop_stale_cache(package, cache)] == [ours[0]]


def test_numba_cache_dir_follows_numba_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from numba.core import config

    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))
    package = Path(_numba_cache.__file__).resolve().parent
    found = _numba_cache.numba_cache_dir(package)
    assert found is not None and found.parent == tmp_path and found.name.startswith("kernels_")


_CALLEE = "from numba import njit\n\n@njit(cache=True)\ndef value():\n    return {}\n"
_CALLER = (
    "from numba import njit\n"
    "from gradzip.kernels._probe_callee import value\n\n"
    "@njit(cache=True)\n"
    "def call():\n"
    "    return value() * 10\n"
)


@pytest.mark.distributed  # starts Python processes (no torch.distributed)
def test_edit_of_a_called_module_reaches_a_cached_kernel(tmp_path: Path) -> None:
    """A cached kernel calling into another module of the package sees that module's edit
    (numba alone would load the old machine code: 10 after the edit below)."""
    src = tmp_path / "src"
    kernels = src / "gradzip" / "kernels"
    kernels.mkdir(parents=True)
    (src / "gradzip" / "__init__.py").write_text("")
    real = Path(_numba_cache.__file__).resolve().parent
    for name in ("__init__.py", "_numba_cache.py", "_numba_cache_lock.py"):
        shutil.copy(real / name, kernels / name)
    (kernels / "_probe_callee.py").write_text(_CALLEE.format(1))
    (kernels / "_probe_caller.py").write_text(_CALLER)
    env = {**os.environ, "PYTHONPATH": str(src), "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    command = [
        sys.executable,
        "-c",
        "from gradzip.kernels._probe_caller import call; print(call())",
    ]

    def run() -> str:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run() == "10"
    assert run() == "10"  # loaded from the cache
    assert list((tmp_path / "cache").rglob("_probe_caller.*.nbi"))
    (kernels / "_probe_callee.py").write_text(_CALLEE.format(2))
    assert run() == "20"
