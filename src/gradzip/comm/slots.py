"""Equal-sized slots for an all-gather in one collective: framing one, reading all of them.

A slot is ``8 + expected_size`` bytes: the header word a ring message starts with (the
payload's length, the sender's flag bit, the device-payload mark: see
:mod:`gradzip.comm.distributed`), the payload, then zeros up to the slot's end. Every rank
contributes one slot and receives all ``P`` of them in rank order (an all-gather, or on the CPU
an all-to-all of the sender's slot to every rank: see
:attr:`gradzip.comm.distributed.DistributedTransport.gather_as_all_to_all`). The receiver
reads the ``P`` header words in one host read and keeps each device payload a view of its
slot, on the device: no payload byte crosses to the host.

This module knows nothing of ``torch.distributed``; it frames and parses, so a test can check
the frames without processes.
"""

from __future__ import annotations

import numpy as np
import torch

from gradzip.comm.transport import FLAG_DOWN_BIT, LENGTH_PREFIX_BYTES, Payload
from gradzip.device.host_reads import host_read
from gradzip.device.ops import bytes_tensor, on_device
from gradzip.errors import GradzipError

#: the header word's mark of a device payload (the receiver keeps it a tensor on its device);
#: the ring's messages carry the same mark
DEVICE_PAYLOAD_BIT = 1 << 61


def header_word(size: int, ok: bool, on_device: bool) -> int:
    """The 8-byte header word of a message of ``size`` payload bytes."""
    word = size if ok else size | FLAG_DOWN_BIT
    return word | DEVICE_PAYLOAD_BIT if on_device else word


def parse_header_word(word: int) -> tuple[int, bool, bool] | None:
    """``(length, flag, device mark)`` of a header word, or None for a word no sender writes
    (bit 63 set: lengths stay below bit 61, the device mark, then the flag at bit 62)."""
    if word >= 2 * FLAG_DOWN_BIT:
        return None
    return (
        word & ~(FLAG_DOWN_BIT | DEVICE_PAYLOAD_BIT),
        not word & FLAG_DOWN_BIT,
        bool(word & DEVICE_PAYLOAD_BIT),
    )


def frame_slot(payload: Payload, ok: bool, slot_bytes: int, device: torch.device) -> torch.Tensor:
    """This rank's slot of ``slot_bytes`` bytes on ``device`` (a new tensor: see
    :func:`write_slot`)."""
    slot = torch.empty(slot_bytes, dtype=torch.uint8, device=device)
    write_slot(slot, payload, ok)
    return slot


def write_slot(slot: torch.Tensor, payload: Payload, ok: bool) -> None:
    """Frame ``payload`` into ``slot`` (a contiguous uint8 tensor of the slot's bytes, e.g. one
    slot of an all-to-all's outgoing buffer): the header word, the payload, zeros to the end;
    the payload's bytes copied once.

    A payload longer than the slot holds is not framed: its slot carries the header word of
    its true length and zeros, so every receiver learns that it did not fit (and says so)
    instead of waiting for a rank that gave up before the collective."""
    is_tensor = isinstance(payload, torch.Tensor)
    size = payload.numel() if isinstance(payload, torch.Tensor) else len(payload)
    capacity = slot.numel() - LENGTH_PREFIX_BYTES
    word = header_word(size, ok, is_tensor).to_bytes(8, "little")
    fits = size <= capacity
    if slot.device.type == "cpu" and not isinstance(payload, torch.Tensor):
        # host bytes into host memory through numpy views: one copy, no temporaries
        into = slot.numpy()
        into[:LENGTH_PREFIX_BYTES] = np.frombuffer(word, dtype=np.uint8)
        end = LENGTH_PREFIX_BYTES + (size if fits else 0)
        if fits and size:
            into[LENGTH_PREFIX_BYTES:end] = np.frombuffer(payload, dtype=np.uint8)
        into[end:] = 0
        return
    # a tensor payload (a device's) or a device slot: tensor copies and fills only, so that
    # nothing of a device payload is read to the host
    slot.narrow(0, 0, LENGTH_PREFIX_BYTES).copy_(bytes_tensor(word, slot.device))
    body = slot.narrow(0, LENGTH_PREFIX_BYTES, capacity)
    if not fits:
        body.zero_()
        return
    if isinstance(payload, torch.Tensor):
        body.narrow(0, 0, size).copy_(on_device(payload.reshape(-1), slot.device))
    elif size:
        body.narrow(0, 0, size).copy_(bytes_tensor(bytes(payload), slot.device))
    body.narrow(0, size, capacity - size).zero_()


def read_slots(
    gathered: torch.Tensor, world_size: int, own_rank: int, own: Payload
) -> tuple[list[Payload], list[int]]:
    """Every rank's payload (``own`` for ``own_rank``) and the ranks whose flag is down, from
    the ``world_size`` slots of ``gathered``; one host read of the header words.

    A device payload comes back as a view of its slot (on ``gathered``'s device), host bytes
    as bytes (read from the slot: only a flag-down rank's empty payload in practice). Raises
    :class:`~gradzip.errors.GradzipError` naming the rank and both sizes for a header word
    that announces more than its slot holds, or that no sender writes."""
    slots = gathered.view(world_size, -1)
    capacity = slots.shape[1] - LENGTH_PREFIX_BYTES
    words = host_read(slots.narrow(1, 0, LENGTH_PREFIX_BYTES))
    out: list[Payload] = []
    down = []
    for rank in range(world_size):
        word = int.from_bytes(words[rank].tobytes(), "little")
        parsed = parse_header_word(word)
        if parsed is None:
            raise GradzipError(
                f"rank {own_rank}: corrupt payload frame from rank {rank}: header word "
                f"{word:#x} has bit 63 set (a header is a length below 2**61, the device mark "
                "and the flag bit)"
            )
        length, flag, is_tensor = parsed
        if length > capacity:
            raise GradzipError(
                f"rank {own_rank}: corrupt payload frame from rank {rank}: its header announces "
                f"{length} bytes, more than the {capacity} bytes of the slot every rank agreed "
                "on (a payload larger than expected_size, or a corrupt header)"
            )
        if not flag:
            down.append(rank)
        if rank == own_rank:
            out.append(own)
            continue
        body = slots[rank].narrow(0, LENGTH_PREFIX_BYTES, length)
        if is_tensor:
            out.append(body)
        else:
            out.append(host_read(body).tobytes() if length else b"")
    return out, down
