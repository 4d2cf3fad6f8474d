"""The repository's own unit tests live beside the items qconform adds (see pytest.ini)."""

from __future__ import annotations

import numpy as np
from my_kernels.q8_k import quantize


def test_output_shape() -> None:
    x = np.linspace(-1, 1, 2 * 512, dtype=np.float32).reshape(2, 512)
    y = quantize(x, "Q8_K")
    assert y.dtype == np.uint8 and y.shape == (2, 2 * 292)
