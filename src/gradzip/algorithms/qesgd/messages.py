"""The messages of distributed QESGD (Algorithm 3) between the parameter server and its workers:
fp32 vectors in either direction, and the failure notices that keep every rank in step.

A star over any :class:`~gradzip.comm.transport.Transport`: rank ``server`` talks to every other
rank, the workers never talk to each other. :meth:`ServerLink.gather` brings every rank's fp32
vector to the server (in rank order; the server's own never crosses the wire),
:meth:`ServerLink.broadcast` gives every rank the server's fp32 vector (the server decodes its
own payload too, so every rank holds the same bits). Each message is an ``identity`` payload:
``32 n`` bits plus a header of a few dozen bytes and the transport's 8-byte length prefix.

Failures: a rank whose vector holds NaN or Inf sends a failure notice instead (one byte ``!``
and text; a payload always starts with ``GZ``). The server then sends every worker a notice
naming the ranks on the stream where the workers wait next (``reply``), and every rank raises
:class:`~gradzip.errors.NonFiniteInputError`. The server uses the same notice (:meth:`fail`)
for its own failures (an offset update or a norm beyond float32), so no worker is left waiting.

Streams and keys [CHOICE]: every message is keyed ``(run_seed, sender, step, stream)``, with
stream (the key's ``tensor_index``) 0 for the offset's codes, 1 for the anchors ``w_t``, 2 for
the gradients and 3 for the calibration; each stream has its own collective name for the byte
meters. The codes' key is also the stochastic rounding's local stream (spec 0.4).

References: Zhao, Gao & Li, "Quantized Epoch-SGD for Communication-Efficient Distributed
Learning", Algorithm 3; spec section 2.2.
"""

from __future__ import annotations

import torch

from gradzip.comm.transport import Transport, host_bytes
from gradzip.compressors.identity import Identity
from gradzip.errors import NonFiniteInputError
from gradzip.keys import StreamKey

_FAIL = b"!"  # first byte of a failure notice (payloads start with b"GZ")
CODES, ANCHOR, GRAD, CALIBRATE = 0, 1, 2, 3  # the streams (the keys' tensor_index)
_COLLECTIVE = {
    CODES: "qesgd_codes",
    ANCHOR: "qesgd_epoch",
    GRAD: "qesgd_grad",
    CALIBRATE: "qesgd_calibrate",
}


class ServerLink:
    """One rank's end of the star between the server and the workers; see the module doc."""

    def __init__(self, transport: Transport, server: int, run_seed: int) -> None:
        if not 0 <= server < transport.world_size:
            raise ValueError(
                f"qesgd: server rank {server} is not in a group of {transport.world_size}"
            )
        self.transport = transport
        self.server = server
        self.run_seed = run_seed
        self._fp32 = Identity()

    @property
    def is_server(self) -> bool:
        return self.transport.rank == self.server

    def key(self, rank: int, step: int, stream: int) -> StreamKey:
        """The key of ``rank``'s message of ``step`` on ``stream``."""
        return StreamKey(self.run_seed, rank, step, stream)

    def send_workers(self, message: bytes, stream: int) -> None:
        """On the server: ``message`` to every worker."""
        for dst in range(self.transport.world_size):
            if dst != self.server:
                self.transport.send_bytes(dst, message, _COLLECTIVE[stream])

    def receive(self, stream: int) -> bytes:
        """On a worker: the server's next message on ``stream``; a failure notice raises."""
        message = host_bytes(self.transport.recv_bytes(self.server, _COLLECTIVE[stream]))
        if message[:1] == _FAIL:
            raise NonFiniteInputError(message[1:].decode(errors="replace"))
        return message

    def fail(self, text: str, stream: int) -> NonFiniteInputError:
        """On the server: send every worker a failure notice on ``stream`` (where each of them
        is waiting) and return the error to raise, so that no rank blocks and every rank
        raises in the same step."""
        self.send_workers(_FAIL + text.encode(), stream)
        return NonFiniteInputError(text)

    def broadcast(
        self, value: torch.Tensor | None, step: int, stream: int, numel: int
    ) -> torch.Tensor:
        """The server's flat fp32 ``value`` (``numel`` entries; ``None`` on the workers) on
        every rank, decoded from the same payload everywhere."""
        key = self.key(self.server, step, stream)
        if self.is_server:
            assert value is not None
            payload = bytes(self._fp32.encode(value, key).payload)
            self.send_workers(payload, stream)
        else:
            payload = self.receive(stream)
        out = self._fp32.decode(payload, expected_key=key, shape=(numel,), dtype=torch.float32)
        return out.reshape(-1)

    def gather(
        self, vector: torch.Tensor, step: int, stream: int, reply: int
    ) -> list[torch.Tensor] | None:
        """Every rank's flat fp32 ``vector`` at the server, in rank order (``None`` on the
        workers). If any of them holds NaN or Inf, the server sends a notice on ``reply`` (the
        stream the workers read next) and raises; the workers raise when they read it."""
        t = self.transport
        finite = bool(torch.isfinite(vector).all())
        if not self.is_server:
            key = self.key(t.rank, step, stream)
            message = bytes(self._fp32.encode(vector, key).payload) if finite else _FAIL
            t.send_bytes(self.server, message, _COLLECTIVE[stream])
            return None
        vectors: list[torch.Tensor] = []
        bad = [] if finite else [t.rank]
        for src in range(t.world_size):
            if src == self.server:
                vectors.append(vector)
                continue
            message = host_bytes(t.recv_bytes(src, _COLLECTIVE[stream]))
            if message[:1] == _FAIL:
                bad.append(src)
                continue
            vectors.append(
                self._fp32.decode(
                    message,
                    expected_key=self.key(src, step, stream),
                    shape=(vector.numel(),),
                    dtype=torch.float32,
                )
            )
        if bad:
            raise self.fail(
                f"qesgd: step {step}: rank(s) {sorted(bad)} have NaN or Inf gradients; no "
                "rank applied anything",
                reply,
            )
        return vectors
