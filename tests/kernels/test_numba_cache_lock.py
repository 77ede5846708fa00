"""numba's cache writes are serialised across processes (:mod:`gradzip.kernels._numba_cache_lock`):
numba alone can file one overload's machine code under another overload's key when two
processes compile different overloads of one function at once."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from numba.core import caching

import gradzip.kernels  # noqa: F401  (installs the lock)
from gradzip.kernels._numba_cache_lock import locked_save


def test_importing_the_kernels_package_installs_the_locked_save() -> None:
    assert caching.IndexDataCacheFile.save is locked_save


def _cache_file(directory: Path) -> Any:
    make: Any = caching.IndexDataCacheFile  # numba is untyped
    return make(str(directory), "kernel-1.py3", source_stamp=("s", 1))


def test_the_data_file_is_written_under_the_lock_and_before_the_index(tmp_path: Path) -> None:
    cache_file = _cache_file(tmp_path)
    seen: list[tuple[str, bool, bool]] = []
    save_data, save_index = cache_file._save_data, cache_file._save_index

    def lock_is_held() -> bool:
        fd = os.open(cache_file._index_path + ".lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def spy_data(name: str, data: Any) -> None:
        seen.append(("data", lock_is_held(), os.path.exists(cache_file._index_path)))
        save_data(name, data)

    def spy_index(overloads: dict[Any, str]) -> None:
        seen.append(("index", lock_is_held(), True))
        save_index(overloads)

    cache_file._save_data, cache_file._save_index = spy_data, spy_index
    cache_file.save(("int64",), b"int code")
    assert seen == [("data", True, False), ("index", True, True)]
    cache_file.save(("int64",), b"int code again")  # same key: same file, index unchanged
    assert seen[2:] == [("data", True, True)]


def test_an_index_another_process_wrote_is_read_inside_the_lock(tmp_path: Path) -> None:
    """Two writers that each opened the cache before the other saved get different files."""
    first, second = _cache_file(tmp_path), _cache_file(tmp_path)
    first.save(("int64",), b"int code")
    second.save(("float64",), b"float code")
    reader = _cache_file(tmp_path)
    assert reader.load(("int64",)) == b"int code"
    assert reader.load(("float64",)) == b"float code"
    assert len(set(reader._load_index().values())) == 2


_KERNELS = "from numba import njit\n" + "".join(
    f"\n@njit(cache=True)\ndef f{i}(x):\n    return x * {i + 2} + 1\n" for i in range(8)
)
_COMPILE = """
import sys, time
from pathlib import Path
import gradzip.kernels  # the lock
import probe_kernels
kind = sys.argv[1]
Path(f"ready-{kind}").touch()
while not (Path("ready-int").exists() and Path("ready-float").exists()):
    time.sleep(0.001)  # a barrier: both processes, numba imported, compile at once
value = 3 if kind == "int" else 3.5
for i in range(8):
    getattr(probe_kernels, f"f{i}")(value)
"""
_CHECK = """
import gradzip.kernels
import probe_kernels
for i in range(8):
    f = getattr(probe_kernels, f"f{i}")
    assert f(3) == 3 * (i + 2) + 1, (i, f(3))
    assert f(3.5) == 3.5 * (i + 2) + 1, (i, f(3.5))
    assert len(f.signatures) == 2 and not f.stats.cache_misses, (i, f.stats)
print("ok")
"""


@pytest.mark.distributed  # starts Python processes (no torch.distributed)
def test_two_processes_compiling_different_overloads_at_once_leave_a_cache_both_can_load(
    tmp_path: Path,
) -> None:
    (tmp_path / "probe_kernels.py").write_text(_KERNELS)
    pythonpath = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": pythonpath, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    compiling = [
        subprocess.Popen([sys.executable, "-c", _COMPILE, kind], env=env, cwd=tmp_path)
        for kind in ("int", "float")
    ]
    assert [process.wait(timeout=180) for process in compiling] == [0, 0]
    done = subprocess.run(
        [sys.executable, "-c", _CHECK],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
