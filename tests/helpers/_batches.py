"""Comparing memoire batches in tests: the one equality check of two ``Batch`` objects."""

import numpy as np


def assert_same_batch(a, b) -> None:
    """``a`` and ``b`` (memoire ``Batch``es) hold the same arrays: prev/next stacks (None in
    the same places), weight, prob, done and id, each of the same dtype and shape."""
    for side in ("prev", "next"):
        for x, y in zip(getattr(a, side), getattr(b, side)):
            if x is None or y is None:
                assert x is None and y is None
            else:
                assert x.dtype == y.dtype and x.shape == y.shape
                np.testing.assert_array_equal(x, y)
    for name in ("weight", "prob", "done", "id"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)
