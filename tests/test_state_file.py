"""State files (:mod:`gradzip.state_file`): what is written is read back exactly, and any
damage to any byte (flipped, zeroed, cut off, appended) or a file without a digest is refused
with a :class:`CheckpointError` naming the file, before anything is unpickled."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from gradzip import state_file
from gradzip.errors import CheckpointError

Damage = Callable[[bytes], bytes]


def state() -> dict[str, object]:
    """Tensors large enough that the 4 KiB blocks below land inside tensor data."""
    gen = torch.Generator().manual_seed(3)
    return {"step": 7, "weights": torch.randn(64, 256, generator=gen), "name": "x", "ok": True}


def flip(offset: int) -> Damage:
    """Invert the 16 bytes at ``offset`` (negative: from the end)."""

    def damage(data: bytes) -> bytes:
        start = offset % len(data)
        return data[:start] + bytes(b ^ 0xFF for b in data[start : start + 16]) + data[start + 16 :]

    return damage


def zero_block(fraction: float) -> Damage:
    """Zero 4 KiB starting ``fraction`` of the way into the file."""

    def damage(data: bytes) -> bytes:
        start = int(len(data) * fraction)
        return data[:start] + bytes(4096) + data[start + 4096 :]

    return damage


def truncate(keep: Callable[[int], int]) -> Damage:
    return lambda data: data[: keep(len(data))]


HEADER = len(b"gradzip-state v1 sha256= bytes=") + 64 + 7  # the header ends near here

#: (damage, what the error says)
DAMAGES: dict[str, tuple[Damage, str]] = {
    "flip the magic": (flip(0), "not a gradzip state file"),
    "flip the digest": (flip(40), "header is malformed"),
    "flip the first payload bytes": (flip(HEADER + 2), "digest does not match"),
    "flip a third in": (lambda d: flip(len(d) // 3)(d), "digest does not match"),
    "flip the middle": (lambda d: flip(len(d) // 2)(d), "digest does not match"),
    "flip the last 16 bytes": (flip(-16), "digest does not match"),
    "zero 4 KiB in the middle": (zero_block(0.5), "digest does not match"),
    "zero 4 KiB at the start of the payload": (zero_block(0.01), "corrupted"),
    "zero the first 4 KiB": (zero_block(0.0), "not a gradzip state file"),
    "truncate by one byte": (truncate(lambda n: n - 1), "truncated"),
    "truncate to half": (truncate(lambda n: n // 2), "truncated"),
    "truncate inside the header": (truncate(lambda n: 20), "corrupted"),
    "truncate to nothing": (truncate(lambda n: 0), "corrupted"),
    "append a byte": (lambda d: d + b"\0", "longer than it should be"),
}


def test_a_state_file_reads_back_exactly(tmp_path: Path) -> None:
    saved = state()
    path = tmp_path / "s.pt"
    state_file.write(path, saved)
    loaded = state_file.read(path)
    assert loaded.keys() == saved.keys() and torch.equal(loaded["weights"], saved["weights"])
    assert (loaded["step"], loaded["name"], loaded["ok"]) == (7, "x", True)
    assert [p.name for p in tmp_path.iterdir()] == ["s.pt"]  # no temporary left behind


def test_the_header_holds_the_sha256_of_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "s.pt"
    state_file.write(path, state())
    header, _, payload = path.read_bytes().partition(b"\n")
    assert header == (
        f"gradzip-state v1 sha256={hashlib.sha256(payload).hexdigest()} "
        f"bytes={len(payload)}".encode()
    )
    # the payload is a plain torch.save file
    assert torch.load(io.BytesIO(payload), weights_only=True)["step"] == 7


@pytest.mark.parametrize("name", list(DAMAGES))
def test_damage_anywhere_is_refused(tmp_path: Path, name: str) -> None:
    damage, says = DAMAGES[name]
    path = tmp_path / "s.pt"
    state_file.write(path, state())
    good = path.read_bytes()
    bad = damage(good)
    assert bad != good
    path.write_bytes(bad)
    with pytest.raises(CheckpointError, match=says) as refused:
        state_file.read(path)
    assert str(path) in str(refused.value) and "not loaded" in str(refused.value)
    assert path.read_bytes() == bad  # reading changes nothing


def test_a_plain_torch_save_without_a_digest_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    torch.save(state(), path)
    with pytest.raises(CheckpointError, match="has no digest") as refused:
        state_file.read(path)
    assert str(path) in str(refused.value)


def test_another_format_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.pt"
    state_file.write(path, state())
    path.write_bytes(b"gradzip-state v2" + path.read_bytes()[len(b"gradzip-state v1") :])
    with pytest.raises(CheckpointError, match="format v2; this gradzip reads v1"):
        state_file.read(path)


def test_intact_bytes_that_are_not_a_torch_state_are_refused(tmp_path: Path) -> None:
    payload = b"not a torch file"
    digest = hashlib.sha256(payload).hexdigest()
    path = tmp_path / "s.pt"
    path.write_bytes(f"gradzip-state v1 sha256={digest} bytes={len(payload)}\n".encode() + payload)
    with pytest.raises(CheckpointError, match="passed its digest check but holds no loadable"):
        state_file.read(path)


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "s.pt"
    state_file.write(path, state())
    before = path.read_bytes()
    with pytest.raises(Exception):  # noqa: B017 - whatever torch raises for an unpicklable
        state_file.write(path, {"f": lambda: None})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["s.pt"]


def test_a_write_that_fails_on_disk_keeps_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.pt"
    state_file.write(path, state())
    before = path.read_bytes()

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(state_file.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        state_file.write(path, {"other": 1})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["s.pt"]
