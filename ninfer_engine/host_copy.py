"""Host values onto the device without making the host wait for the device."""
from __future__ import annotations

import torch


def to_device(values, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`values` (a host tensor or a list) as a tensor on `device`.

    On CUDA the copy leaves from page-locked memory, asynchronously: a blocking copy from
    pageable memory synchronises the stream, so one in the middle of a forward makes the host
    wait for every kernel queued before it, and the GPU then waits for the host's next launches.
    The caching host allocator keeps the page-locked buffer until its copy is done."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if dtype is not None and host.dtype != dtype:
        host = host.to(dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
