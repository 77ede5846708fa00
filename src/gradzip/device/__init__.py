"""Payloads that live where the gradient lives: device framing, checks and host-read accounting.

A *device payload* is a 1-D ``torch.uint8`` tensor on the gradient's device holding exactly the
bytes of the host payload of :mod:`gradzip.payload` (header, body, CRC-32): one wire format.
A codec whose :attr:`~gradzip.compressors.base.Compressor.device_resident` is True encodes a
tensor that is not on the CPU into one without reading anything back to the host, and decodes
one on its device; the schemes send it through the transport as it is.

Rules for device code in gradzip (why: the checks in CI run it on *fake* CUDA tensors,
``torch._subclasses.fake_tensor.FakeTensorMode``, on a CPU build of torch, where some Python
paths of torch fail although the same operation by another name works):

* no Python indexing or slicing of a device tensor (``t[a:b]``, ``t[i]``, ``t[mask]``,
  ``t[...] = v``): use ``narrow``, ``select``, ``split``, ``index_select``, ``gather``,
  ``take``, ``torch.cat``, ``index_copy``, ``torch.where``;
* no ``t.to(device)`` onto the device it is already on (:func:`~gradzip.device.ops.on_device`
  skips it) and no host tensor moved to the device: build small constants with
  ``torch.tensor(values, device=...)``;
* no ``contiguous()`` of a strided view: ``reshape`` or ``clone(memory_format=...)``;
* no read of a value on the host (``.item()``, ``bool(t)``, ``.cpu()``, ``.tolist()``) except
  through :func:`~gradzip.device.host_reads.host_read`, which the tests count.
"""
