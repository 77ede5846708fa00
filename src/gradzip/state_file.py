"""State files that prove they are intact: a one-line header carrying the SHA-256 digest of
the payload, then the payload (one ``torch.save``), written atomically, verified before it is
unpickled.

Layout, one file:

    gradzip-state v1 sha256=<64 lowercase hex digits> bytes=<payload length>\\n
    <payload: exactly the bytes torch.save wrote>

so ``tail -n +2 FILE | sha256sum`` prints the digest in the first line.

Why [CHOICE]: a ``torch.save`` file checks nothing when it is read back: flipped bytes or a
zeroed block inside a tensor's record load without complaint, and only a truncated file
fails. The digest goes *inside* the file, not in a ``.sha256`` sidecar, so that the digest
and the bytes it covers are written by one rename and can never come from two different
saves (a crash between two renames, or a copy of one file without the other). The file is
read into memory once and the digest checked on those bytes before ``torch.load`` sees them,
so what is verified is what is loaded (no second read that could differ). Every byte of the
file is covered: the payload by the digest, the header by its fixed layout and the declared
length.

A file without the header (a plain ``torch.save``, as gradzip wrote before state files
carried a digest) is refused: no release wrote that format, and a file that cannot be
verified cannot be told from a corrupted one.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from pathlib import Path
from typing import Any

import torch

from gradzip.errors import CheckpointError

_VERSION = 1
_MAGIC = b"gradzip-state v"
_HEADER = re.compile(rb"gradzip-state v(\d+) sha256=([0-9a-f]{64}) bytes=(\d+)\n")
#: the longest header the format allows (a 20-digit length); a longer first line is not one
_MAX_HEADER = len(b"gradzip-state v1 sha256= bytes=\n") + 64 + 20
#: how the formats gradzip wrote before the header begin: torch.save's zip archive, or a
#: legacy (protocol 2+) pickle
_PLAIN_TORCH = (b"PK\x03\x04", b"\x80")


def encode(obj: Any) -> bytes:
    """``obj`` as the bytes of a state file: the header, then its ``torch.save`` bytes."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    payload = buffer.getvalue()
    digest = hashlib.sha256(payload).hexdigest()
    return f"gradzip-state v{_VERSION} sha256={digest} bytes={len(payload)}\n".encode() + payload


def write(path: str | Path, obj: Any) -> None:
    """Save ``obj`` to ``path`` as a state file, atomically: written and flushed to disk under
    ``<path>.tmp``, then renamed over ``path`` (a crash leaves the old file or the new one,
    never a mix), then the directory is flushed so the rename itself survives a crash."""
    target = Path(path)
    data = encode(obj)  # serialized before the temporary file is opened: a failing save
    temporary = target.with_name(target.name + ".tmp")  # leaves no temporary behind
    try:
        with temporary.open("wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        temporary.replace(target)
    except BaseException:  # a full disk or a signal mid-write: the old file stays, alone
        temporary.unlink(missing_ok=True)
        raise
    _sync_directory(target.parent)


def _sync_directory(directory: Path) -> None:
    if os.name != "posix":  # pragma: no cover - directories cannot be opened elsewhere
        return
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def verified_payload(data: bytes, path: str | Path) -> memoryview:
    """The payload of the state-file bytes ``data`` (read from ``path``, named in errors),
    after checking its header, its length and its SHA-256 digest. Raises
    :class:`CheckpointError` saying what is wrong; nothing is unpickled here."""
    end = data.find(b"\n", 0, _MAX_HEADER)
    match = _HEADER.fullmatch(data, 0, end + 1) if end >= 0 else None
    if match is None:
        raise CheckpointError(_bad_header(data, path))
    version, expected, declared = int(match[1]), match[2].decode(), int(match[3])
    if version != _VERSION:
        raise CheckpointError(
            f"{path} has state-file format v{version}; this gradzip reads v{_VERSION} (written "
            "by another gradzip version, or its header is corrupted); it was not loaded"
        )
    body = memoryview(data)[end + 1 :]
    if len(body) != declared:
        what = "truncated" if len(body) < declared else "longer than it should be"
        raise CheckpointError(
            f"{path} is corrupted: {what} ({len(body)} payload bytes, its header declares "
            f"{declared}); it was not loaded"
        )
    actual = hashlib.sha256(body).hexdigest()
    if actual != expected:
        raise CheckpointError(
            f"{path} is corrupted: its SHA-256 digest does not match (header {expected[:16]}..., "
            f"contents {actual[:16]}...); it was not loaded"
        )
    return body


def _bad_header(data: bytes, path: str | Path) -> str:
    """Why ``data`` has no valid header: an older digest-less file, a damaged header, or
    something else entirely."""
    if data.startswith(_MAGIC):
        return f"{path} is corrupted: its header is malformed; it was not loaded"
    if data.startswith(_PLAIN_TORCH):
        return (
            f"{path} has no digest (a plain torch.save file, as gradzip wrote before its state "
            "files carried a SHA-256 digest), so it cannot be checked for corruption and was "
            "not loaded; start the run again"
        )
    return (
        f"{path} is not a gradzip state file, or it is corrupted: it does not start with a "
        "'gradzip-state' header; it was not loaded"
    )


def read(path: str | Path) -> Any:
    """The object saved in the state file ``path`` by :func:`write`, verified (see
    :func:`verified_payload`) and then loaded with ``torch.load(weights_only=True)`` (tensors,
    numbers, strings and containers: no code). Raises :class:`CheckpointError` if the file
    is corrupted, truncated or has no digest; ``OSError`` if it cannot be read."""
    body = verified_payload(Path(path).read_bytes(), path)
    try:
        return torch.load(io.BytesIO(body), weights_only=True)
    except Exception as err:  # intact bytes that are no torch state: say which file
        raise CheckpointError(
            f"{path} passed its digest check but holds no loadable state: {err}"
        ) from err
