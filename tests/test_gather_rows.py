"""_core.gather_rows: the native batch gather behind ReplayMemoryServer.get_batch (cache mode)."""

import numpy as np
import pytest

from memoire import _core


def _pairs(rng, rows_in_src=10, n_out=7):
    srcs = [rng.integers(0, 255, (rows_in_src, 3, 4), dtype=np.uint8),
            rng.standard_normal((rows_in_src, 2)).astype(np.float32),
            np.arange(rows_in_src, dtype=np.int64),
            np.zeros((rows_in_src, 0), np.uint8),      # zero-byte rows (an empty info field)
            np.array(0xABCDEF, np.uint64),             # 0-d: fills every row
            np.float32(2.5)]                           # a numpy scalar too
    outs = [np.zeros((n_out,) + s.shape[1:], s.dtype) if s.ndim else np.zeros(n_out, s.dtype)
            for s in srcs]
    return srcs, outs


def test_matches_take_at_an_offset_and_leaves_other_rows():
    rng = np.random.default_rng(0)
    srcs, outs = _pairs(rng)
    rows = rng.permutation(10)[:4]
    _core.gather_rows(srcs, rows, outs, 2)
    for s, o in zip(srcs, outs):
        if s.ndim == 0:
            assert (o[2:6] == s).all() and (o[:2] == 0).all() and (o[6:] == 0).all()
            continue
        np.testing.assert_array_equal(o[2:6], s[rows])
        assert not o[:2].any() and not o[6:].any()


def test_repeated_rows_and_other_integer_dtypes():
    rng = np.random.default_rng(1)
    srcs, outs = _pairs(rng)
    rows = np.array([3, 3, 0, 9, 3, 1, 1], np.int32)
    _core.gather_rows(srcs, rows, outs)
    np.testing.assert_array_equal(outs[0], srcs[0][rows])
    np.testing.assert_array_equal(outs[2], rows.astype(np.int64))


@pytest.mark.parametrize("bad, match", [
    (lambda s, o, r: (s, np.array([0, 10]), o, 0), r"row numbers must lie in \[0, 10\), got 10"),
    (lambda s, o, r: (s, np.array([-1, 0]), o, 0), r"got -1"),
    (lambda s, o, r: (s, r, o, 5), r"do not fit an output of 7 rows"),
    (lambda s, o, r: (s, r.astype(np.float64), o, 0), r"1-d integer array, got float64\[3\]"),
    (lambda s, o, r: (s, r, o[:-1], 0), r"as many outputs as sources"),
    (lambda s, o, r: (s, r, [o[0].astype(np.int8)] + o[1:], 0), r"dtype"),
    (lambda s, o, r: (s, r, [np.zeros((7, 4, 3), np.uint8)] + o[1:], 0), r"row shape|shape"),
    (lambda s, o, r: (s, r, [o[0][::-1]] + o[1:], 0), r"C-contiguous"),
    (lambda s, o, r: (s, r, [o[0].tolist()] + o[1:], 0), r"expected numpy arrays"),
    (lambda s, o, r: ([s[0].tolist()] + s[1:], r, o, 0), r"expected numpy arrays"),
])
def test_bad_input_raises_and_copies_nothing(bad, match):
    rng = np.random.default_rng(2)
    srcs, outs = _pairs(rng)
    rows = np.array([1, 2, 3])
    args = bad(srcs, outs, rows)
    before = [o.copy() for o in outs]
    with pytest.raises(ValueError, match=match):
        _core.gather_rows(*args)
    for o, b in zip(outs, before):
        np.testing.assert_array_equal(o, b)


def test_read_only_output_is_refused():
    src = np.arange(6, dtype=np.float32).reshape(3, 2)
    out = np.zeros((2, 2), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        _core.gather_rows([src], np.array([0, 1]), [out])
