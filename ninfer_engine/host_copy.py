"""Host values onto the device without making the host wait for the device."""
from __future__ import annotations

import numpy as np
import torch

_NUMPY = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32,
          torch.bool: np.bool_}


def to_device(values, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`values` (a host tensor, a numpy array or a list) as a tensor on `device`.

    On CUDA the copy leaves from page-locked memory, asynchronously: a blocking copy from
    pageable memory synchronises the stream, so one in the middle of a forward makes the host
    wait for every kernel queued before it, and the GPU then waits for the host's next launches.
    The caching host allocator keeps the page-locked buffer until its copy is done."""
    host = values if isinstance(values, torch.Tensor) else _host_tensor(values, dtype)
    if dtype is not None and host.dtype != dtype:
        host = host.to(dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _host_tensor(values, dtype: torch.dtype | None) -> torch.Tensor:
    """A list (or array) as a host tensor through numpy: `torch.tensor` converts a list element
    by element (1-2 ms for a 4,096-token prompt step's ids, against ~0.2 ms); the dtypes it
    infers (a list: int64 for ints, float32 for floats, bool; an array keeps its own)."""
    if dtype is not None and dtype not in _NUMPY:
        return torch.tensor(values, dtype=dtype)
    array = np.asarray(values, dtype=None if dtype is None else _NUMPY[dtype])
    if dtype is None and array.dtype == np.float64 and not isinstance(values, np.ndarray):
        array = array.astype(np.float32)  # a list of floats: torch's default dtype
    return torch.from_numpy(array)
