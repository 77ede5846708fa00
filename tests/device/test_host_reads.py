"""The host-read instrument sees every way a value reaches the host."""

from __future__ import annotations

import numpy as np
import torch

from gradzip.device.host_reads import count_host_reads, host_read


def test_counts_scalar_reads_numpy_and_sanctioned_reads() -> None:
    t = torch.arange(10, dtype=torch.float32)
    with count_host_reads() as reads:
        float(t.sum())
        bool((t > 3).any())
        t.numpy()
        np.asarray(t)
        host_read(t[:3])
        t.tolist()
    kinds = [what for what, _, _ in reads.records]
    assert kinds.count("host_read") == 1
    assert any(k.startswith("scalar") for k in kinds)
    assert "Tensor.numpy" in kinds and "Tensor.__array__" in kinds
    assert reads.count >= 6
    assert dict((w, s) for w, s, _ in reads.records)["host_read"] == 12


def test_counts_nothing_for_pure_tensor_work() -> None:
    t = torch.randn(1000)
    with count_host_reads() as reads:
        (t * 2 + 1).sort()
        torch.cat([t, t]).view(torch.uint8)
    assert reads.count == 0, reads.describe()


def test_restores_numpy_after_the_block() -> None:
    before = torch.Tensor.numpy
    with count_host_reads():
        pass
    assert torch.Tensor.numpy is before


def test_forced_modes_count_blocks_closed_by_threads_in_any_order() -> None:
    """Simulated ranks open and close the forced device mode in their own threads; however the
    blocks interleave, the mode is off once every block is closed."""
    import threading

    from gradzip.device.mode import device_path, forced_device_payloads
    from gradzip.kernels.backend import use_torch_ops

    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with forced_device_payloads():
            first_in.set()
            second_in.wait()
        first_out.set()

    def second() -> None:
        first_in.wait()
        with forced_device_payloads():
            second_in.set()
            first_out.wait()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not device_path(torch.zeros(1)) and not use_torch_ops(torch.zeros(1))
