"""Dryden et al.'s allreduce: pairwise-exchange reduce-scatter, then a ring allgather, with
every slice re-quantized on the way (spec 5.6)."""

from __future__ import annotations

import torch

from gradzip.comm.transport import Transport, in_step_scope
from gradzip.device.mode import device_path
from gradzip.device.ops import on_device
from gradzip.feedback import working_dtype
from gradzip.kernels.device_division import divided
from gradzip.schemes._slices import slice_bounds
from gradzip.schemes.base import Scheme


class RingRequantize(Scheme):
    """Compressed reduce-scatter + allgather, with the sender and owner error-feedback buffers.

    A rank that rejects a message (another step or seed) stops; its neighbours then fail when
    the transport's timeout expires, not at once as in the server schemes.

    The tensor is split into ``P`` contiguous slices along its first axis (rows of a weight
    matrix, i.e. per output neuron; elements of a vector), sizes differing by at most one row;
    rank ``r`` owns slice ``r``.

    * **Reduce-scatter** (pairwise exchange): in round ``k = 1 .. P-1`` rank ``r`` sends its
      slice ``(r+k) % P``, compressed, to that slice's owner and receives its own slice from
      rank ``(r-k) % P``; it adds the decoded slices to its own, uncompressed, part.
    * **Allgather** (ring): the owner compresses the summed slice once (its decoded value is
      what the owner uses too) and the compressed slices travel around the ring ``P - 1``
      times, forwarded without re-encoding.

    Every rank ends with the same quantized sum, divided by ``P`` for the mean.

    Bytes per rank and step: ``2 (P-1)`` messages of about ``1/P`` of a full payload each,
    i.e. about ``2 (P-1)/P`` times the compressed tensor, almost constant in ``P`` (spec 5.6;
    versus ``O(n log P)`` for MPI_Allreduce). Each message has its own header (about 20-30
    bytes), and a compressor with a per-slice scale sends ``P`` times more scales.

    Variance: two compressions in series: every rank's contribution is compressed once on the
    way to the owner and the summed slice once more. For unbiased compressors of relative
    variance ``omega``, the mean's error variance is about ``omega/P^2 * sum_p ||g_p||^2 +
    omega * ||mean||^2``, i.e. the second compression does not shrink with ``P``. With error
    feedback both errors are delayed rather than lost.

    Error feedback (``error_feedback=True``): role ``"reduce_scatter"``, one residual per
    (tensor, destination slice) on each sender (``E_rs``), and role ``"allgather"``, one per
    owned slice (``E_ag``), as in spec 5.6 and the LBANN code.

    Keys: a reduce-scatter message carries ``(sender, step, tensor, chunk=slice)``, an
    allgather message ``(owner, step, tensor, chunk=P + slice)`` [CHOICE], so the two phases
    never share a random stream.

    References: Dryden, Moon, Jacobs & Van Essen, "Communication Quantization for
    Data-parallel Training of Deep Neural Networks" (MLHPC 2016); spec 5.6.
    """

    name = "ring"
    feedback_roles = ("reduce_scatter", "allgather")

    @in_step_scope
    def reduce(
        self, transport: Transport, tensor: torch.Tensor, step: int, tensor_index: int = 0
    ) -> torch.Tensor:
        size, rank = transport.world_size, transport.rank
        work = working_dtype(tensor.dtype)
        # [CHOICE] a device-resident codec keeps a device tensor where it is: its payloads are
        # device payloads, its slices views (narrow), and the result stays on the device
        resident = self.compressor.device_resident and device_path(tensor)
        x = tensor.detach() if resident else tensor.detach().to("cpu")
        # slices along the first axis; a vector stays a vector, so per-row codecs (onebit)
        # group its slices as they would the whole vector
        rows = x.reshape(1) if x.dim() == 0 else x
        bounds = slice_bounds(rows.shape[0], size)

        def piece(t: torch.Tensor, part: int) -> torch.Tensor:
            lo, hi = bounds[part]
            return t.narrow(0, lo, hi - lo)

        acc = piece(rows, rank).to(work, copy=True)
        for k in range(1, size):
            dst, src = (rank + k) % size, (rank - k) % size
            payload, dtype = self.encode_own(
                "reduce_scatter", piece(rows, dst), self.key(rank, step, tensor_index, dst)
            )
            got = transport.exchange_bytes(dst, payload, src, "reduce_scatter")
            key = self.key(src, step, tensor_index, rank)
            # bitwise acc += decode(...) in the working dtype, without the dense temporary's
            # separate cast
            self.compressor.decode_add_(got, acc, expected_key=key, dtype=dtype)
        parts: list[torch.Tensor | None] = [None] * size
        own_key = self.key(rank, step, tensor_index, size + rank)
        # the owner's reconstruction of its summed slice comes with the encode (error feedback
        # computes it anyway): no decode of its own message
        message, dtype, own = self.encode_own_reconstructed("allgather", acc, own_key)
        parts[rank] = own
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        for k in range(size - 1):
            message = transport.exchange_bytes(nxt, message, prv, "allgather")
            part = (rank - k - 1) % size
            key = self.key(part, step, tensor_index, size + part)
            shape = piece(rows, part).shape
            parts[part] = self.decode(message, key, shape, dtype)
        # every part in the working dtype, concatenated: the host path's copies into ``out``
        home = x.device if resident else torch.device("cpu")
        out = torch.cat([on_device(p, home).to(work) for p in parts if p is not None])
        if resident:
            # a true division on the device (CUDA divides by a host scalar via its reciprocal)
            return divided(out, float(size)).reshape(tensor.shape)
        return out.div_(size).reshape(tensor.shape)
