"""Fuzz of TF-face checkpoint loading: mutated valid checkpoints, and pickles composed
from the globals the checkpoint unpickler allows (numpy dtypes with crafted states, arrays whose
data does not match their shape, scalars, sets, SumTrees).

Every load either succeeds (and the buffer then adds and samples) or raises CheckpointError with
the buffer unchanged. scripts/sanitize.sh runs this file against the ASan/UBSan build of the
extension, so a bad read or write in the native restore, add or sample paths fails it there.
"""

import gzip
import shutil
import tempfile

import _hostile as h
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memoire import CapacityError
from memoire.dopamine_compat import checkpoint
from memoire.dopamine_compat.checkpoint import CheckpointError

FUZZ = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_GENUINE = {}


def genuine(prioritized):
    """The files of one valid checkpoint (iteration 0), made once per kind."""
    if prioritized not in _GENUINE:
        directory = tempfile.mkdtemp(prefix="memoire-fuzz-")
        src = h.small_buffer(prioritized)
        h.fill(src, 27)
        h.saved(src, directory)
        _GENUINE[prioritized] = directory
    return _GENUINE[prioritized]


def attempt(prioritized, replace):
    """Loads the genuine checkpoint with files replaced by `replace` {name: raw file bytes} into
    a filled buffer; checks the outcome: loaded and usable, or refused and unchanged."""
    target = h.small_buffer(prioritized, seed=7)
    h.fill(target, 11, start=300)
    before = h.snapshot(target)
    with tempfile.TemporaryDirectory(prefix="memoire-fuzz-") as directory:
        for name in checkpoint.attribute_names(target):
            src = h.path(genuine(prioritized), name)
            dst = h.path(directory, name)
            if name in replace:
                with open(dst, "wb") as f:
                    f.write(replace[name])
            else:
                shutil.copyfile(src, dst)
        try:
            target.load(directory, 0)
            loaded = True
        except CheckpointError as e:
            assert isinstance(e, ValueError)
            assert directory in str(e), str(e)
            h.assert_same(h.snapshot(target), before)
            loaded = False
    count = int(target.add_count)
    try:
        h.fill(target, 7, start=500)
        assert int(target.add_count) > count
    except CapacityError:  # a loaded count at the limit (2**62): adds fail, nothing changes
        assert loaded and count > 2**62 - 100 and int(target.add_count) == count
    try:
        target.sample_transition_batch(4)
    except (
        RuntimeError
    ):  # a loaded checkpoint may leave too few valid transitions (Dopamine's error)
        assert loaded
    return loaded


def _names(prioritized):
    return checkpoint.attribute_names(h.small_buffer(prioritized))


@st.composite
def mutation(draw, payload, start=0):
    """`payload` with a few random edits at or after `start`: bit flips, a cut, an insertion, or
    a splice."""
    data = bytearray(payload)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "set"]))
        pos = draw(st.integers(min(start, max(len(data) - 1, 0)), max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del data[pos : pos + draw(st.integers(1, 64))]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        else:
            value = draw(st.binary(min_size=1, max_size=8))
            data[pos : pos + len(value)] = value
    return bytes(data)


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
@FUZZ
@given(data=st.data())
def test_mutated_checkpoint_files(prioritized, data):
    name = data.draw(st.sampled_from(_names(prioritized)))
    payload = h.read_payload(genuine(prioritized), name)
    where = data.draw(st.sampled_from(["values", "anywhere", "gzip"]))
    if where == "gzip":  # the container itself
        with open(h.path(genuine(prioritized), name), "rb") as f:
            raw = data.draw(mutation(f.read()))
    else:
        # "values": past a .npy header (10 bytes + its length), so that most edits change data.
        npy = payload.startswith(b"\x93NUMPY\x01")
        start = 10 + int.from_bytes(payload[8:10], "little") if npy and where == "values" else 0
        raw = gzip.compress(data.draw(mutation(payload, start)), compresslevel=1)
    attempt(prioritized, {name: raw})


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
@FUZZ
@given(count=st.one_of(st.integers(0, 100), st.integers(0, 2**62)))
def test_any_consistent_add_count_loads_and_stays_usable(prioritized, count):
    buffer = h.small_buffer(prioritized)
    raw = {"add_count": gzip.compress(h.npy(np.array(count, np.int64)))}
    expected = np.zeros(h.STACK) if count == 0 else checkpoint.buffer_invalid_range(buffer, count)
    raw["invalid_range"] = gzip.compress(h.npy(expected))
    assert attempt(prioritized, raw)


# ---- pickles from the allowed globals -------------------------------------------------------------

DTYPE_CODES = [
    "f8",
    "f4",
    "f2",
    "i8",
    "i4",
    "u1",
    "b1",
    "V8",
    "V0",
    "O",
    "S4",
    "U2",
    "c16",
    "M8",
    "i4,i4",
    "(3)f8",
    "",
    "float64",
]


@st.composite
def dtype_state(draw):
    kind = draw(st.sampled_from(["none", "plain", "offset", "subarray", "sizes", "junk"]))
    if kind == "none":
        return None
    if kind == "plain":
        return h.plain_dtype_state(draw(st.sampled_from(["<", ">", "|", "=", "x"])))
    if kind == "offset":
        return h.field_at_offset_state(
            draw(st.integers(0, 1 << 40)), draw(st.sampled_from([-1, 0, 1, 8, 1 << 20]))
        )
    if kind == "subarray":
        return h.subarray_state(draw(st.integers(0, 1 << 30)), draw(st.sampled_from([-1, 0, 8])))
    if kind == "sizes":
        return h.lit(
            (
                3,
                draw(st.sampled_from(["<", "|"])),
                None,
                None,
                None,
                draw(st.integers(-2, 1 << 20)),
                draw(st.integers(-2, 64)),
                draw(st.integers(0, 255)),
            )
        )
    return h.lit(tuple(draw(st.lists(st.integers(-5, 5), max_size=9))))


@st.composite
def dtype_ops(draw):
    return h.dtype_ops(draw(st.sampled_from(DTYPE_CODES)), draw(dtype_state()))


SHAPES = st.lists(st.one_of(st.integers(0, 20), st.just(1 << 40), st.just(-1)), max_size=3)


@st.composite
def array_ops(draw):
    shape = tuple(draw(SHAPES))
    data = draw(st.one_of(st.binary(max_size=256), st.integers(0, 300).map(bytes)))
    return h.array_ops(shape, draw(dtype_ops()), data, draw(st.booleans()))


@st.composite
def scalar_ops(draw):
    return h.scalar_ops(draw(dtype_ops()), draw(st.binary(max_size=16)))


def plain_int_ops(draw):
    return h.lit(draw(st.integers(-2, 40)))


@st.composite
def item_ops(draw):
    kind = draw(st.sampled_from(["int", "scalar", "int-scalar", "array", "ndarray", "str"]))
    if kind == "int":
        return plain_int_ops(draw)
    if kind == "scalar":
        return draw(scalar_ops())
    if kind == "int-scalar":  # well formed: an int64 slot number
        return h.scalar_ops(
            h.dtype_ops("i8", h.plain_dtype_state()), np.int64(draw(st.integers(-1, 20))).tobytes()
        )
    if kind == "array":
        return draw(array_ops())
    if kind == "ndarray":  # numpy.ndarray called directly, as a constructor
        return h.glob("numpy", "ndarray") + h.lit((tuple(draw(SHAPES)), "f8")) + h.REDUCE
    return h.lit("x")


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
@FUZZ
@given(data=st.data())
def test_pickled_episode_ends_from_allowed_globals(prioritized, data):
    items = data.draw(st.lists(item_ops(), max_size=6))
    attempt(prioritized, {"episode_end_indices": gzip.compress(h.set_pickle(items))})


@FUZZ
@given(data=st.data())
def test_pickled_sum_tree_from_allowed_globals(data):
    leaves = np.asarray(
        data.draw(
            st.lists(
                st.one_of(st.floats(0, 10), st.sampled_from([0.0, 5e-324, 1e300, 1.7e308])),
                min_size=16,
                max_size=16,
            )
        )
    )
    levels = [h.plain_level_ops(level) for level in h.sum_tree_levels(leaves)]
    for _ in range(data.draw(st.integers(0, 2))):  # none: leaves of any value load
        k = data.draw(st.integers(0, len(levels) - 1))
        levels[k] = data.draw(st.one_of(array_ops(), scalar_ops(), st.just(h.lit(None))))
    if data.draw(st.integers(0, 3)) == 0:
        levels = levels[: data.draw(st.integers(0, len(levels)))]
    top = data.draw(st.one_of(st.just(None), scalar_ops(), st.just(h.lit(float("nan")))))
    attempt(True, {"sum_tree": gzip.compress(h.sum_tree_pickle(levels, top))})


def teardown_module(module):
    del module
    for directory in _GENUINE.values():
        shutil.rmtree(directory, ignore_errors=True)
    _GENUINE.clear()
