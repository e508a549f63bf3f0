"""`host_copy.to_device` builds a list's host tensor through numpy: the same values and the
dtypes `torch.tensor` gives."""
import numpy as np
import pytest
import torch

from ninfer_engine.host_copy import to_device


@pytest.mark.parametrize("values", [[3, 1, 2], [0.5, -1.25], [True, False], [], [[1, 2], [3, 4]],
                                    np.arange(6, dtype=np.int32).reshape(2, 3), np.ones(3),
                                    (7, 8), range(5), list(range(100_000, 104_096))])
@pytest.mark.parametrize("dtype", [None, torch.long, torch.int32, torch.float32, torch.bfloat16])
def test_a_list_becomes_what_torch_tensor_makes_of_it(values, dtype):
    want = torch.tensor(values if isinstance(values, np.ndarray) else list(values), dtype=dtype)
    got = to_device(values, torch.device("cpu"), dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)
