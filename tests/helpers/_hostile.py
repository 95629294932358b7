"""Builders of hostile replay checkpoints, for tests/hostile/test_checkpoints_hostile.py and the
checkpoint fuzz test: tampered Dopamine (TF-face) checkpoint files, pickles assembled opcode by
opcode from only the globals memoire's checkpoint unpickler allows, gzip bombs and lying .npy
headers. Nothing here imports TensorFlow or JAX.
"""

import gzip
import io
import os
import pickle
import struct
import zlib

import numpy as np

from memoire.dopamine_compat import (
    OutOfGraphPrioritizedReplayBuffer,
    OutOfGraphReplayBuffer,
    checkpoint,
)

OBS_SHAPE = (3,)
STACK = 2
CAPACITY = 16
HORIZON = 1


def small_buffer(prioritized=False, seed=0):
    """A TF-face buffer: uint8[3] observations, stack 2, capacity 16."""
    cls = OutOfGraphPrioritizedReplayBuffer if prioritized else OutOfGraphReplayBuffer
    return cls(OBS_SHAPE, STACK, CAPACITY, 4, update_horizon=HORIZON, seed=seed)


def fill(buffer, steps, start=0):
    """Adds `steps` transitions (episodes of 5 steps); observations count up from `start`.
    `buffer` is a TF-face buffer or its remote proxy."""
    prioritized = getattr(buffer, "_PRIORITIZED", getattr(buffer, "_prioritized", False))
    for k in range(start, start + steps):
        obs = np.full(OBS_SHAPE, k % 251, np.uint8)
        kw = {"priority": 1.0 + k % 3} if prioritized else {}
        buffer.add(obs, k % 2, float(k), (k % 5) == 4, **kw)


def snapshot(buffer):
    """Everything a load may change, as plain values (to show a buffer unchanged)."""
    state = {
        "add_count": int(buffer.add_count),
        "ends": sorted(buffer.episode_end_indices),
        "store": {name: np.array(col) for name, col in buffer._store.items()},  # pylint: disable=protected-access
    }
    if buffer._PRIORITIZED:  # pylint: disable=protected-access
        core = buffer._core  # pylint: disable=protected-access
        state["priorities"] = core.get_priorities(np.arange(CAPACITY, dtype=np.int64))
        state["max"] = core.max_recorded_priority
    return state


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if key == "store":
            for name in a[key]:
                np.testing.assert_array_equal(a[key][name], b[key][name], err_msg=name)
        else:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def path(directory, name, iteration=0):
    return checkpoint.generate_filename(str(directory), name, iteration)


def write(directory, name, payload, iteration=0):
    """Replaces checkpoint file `name` by gzip(`payload`)."""
    with open(path(directory, name, iteration), "wb") as f:
        f.write(gzip.compress(payload, compresslevel=1))


def read_payload(directory, name, iteration=0):
    with gzip.open(path(directory, name, iteration), "rb") as f:
        return f.read()


def npy(array):
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def npy_header(shape, descr="<i8"):
    """A .npy v1.0 header claiming `shape` of `descr` (a dtype string or a structured dtype's
    list of fields), followed by no data."""
    text = "{{'descr': {!r}, 'fortran_order': False, 'shape': {}, }}".format(descr, tuple(shape))
    text += " " * ((64 - (10 + len(text) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


def gzip_bomb(inflated_bytes, chunk=1 << 20):
    """A gzip file that inflates to `inflated_bytes` zeros (about 1000:1), built chunk by chunk
    so that building it does not hold the inflated bytes."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(chunk)
    parts = []
    for _ in range(inflated_bytes // chunk):
        parts.append(comp.compress(zeros))
    parts.append(comp.flush())
    return b"".join(parts)


# ---- pickles from the allowed globals, opcode by opcode -----------------------------------------


def glob(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def lit(value):
    """Opcodes that push `value` (a str, int, float, bytes, None, bool or tuple of those)."""
    return pickle.dumps(value, protocol=3)[2:-1]


MARK, TUPLE, REDUCE, BUILD, EMPTY_DICT, SETITEM = b"(", b"t", b"R", b"b", b"}", b"s"
EMPTY_LIST, APPEND = b"]", b"a"


def dtype_ops(code, state=None):
    """numpy.dtype(code, False, True), then BUILD with `state` (raw opcodes pushing a tuple) if
    given: numpy's own pickling of a dtype, or a crafted one."""
    ops = glob("numpy", "dtype") + lit((code, False, True)) + REDUCE
    if state is not None:
        ops += state + BUILD
    return ops


def plain_dtype_state(endian="<"):
    return lit((3, endian, None, None, None, -1, -1, 0))


def field_at_offset_state(offset, itemsize=8):
    """A dtype state with one float64 field 'a' at byte `offset` of an item of `itemsize` bytes."""
    fields = (
        EMPTY_DICT
        + lit("a")
        + MARK
        + dtype_ops("f8", plain_dtype_state())
        + lit(offset)
        + TUPLE
        + SETITEM
    )
    return (
        MARK
        + lit(3)
        + lit("|")
        + lit(None)
        + lit(("a",))
        + fields
        + lit(itemsize)
        + lit(1)
        + lit(16)
        + TUPLE
    )


def subarray_state(count, itemsize=8):
    """A dtype state with a float64 subarray of `count` items in an item of `itemsize` bytes."""
    sub = MARK + dtype_ops("f8", plain_dtype_state()) + lit((count,)) + TUPLE
    return (
        MARK
        + lit(3)
        + lit("|")
        + sub
        + lit(None)
        + lit(None)
        + lit(itemsize)
        + lit(1)
        + lit(0)
        + TUPLE
    )


def array_ops(shape, dtype_opcodes, data, fortran=False):
    """numpy's pickling of an ndarray: _reconstruct(ndarray, (0,), b'b') then BUILD with
    (1, shape, dtype, fortran, data)."""
    ops = (
        glob("numpy.core.multiarray", "_reconstruct")
        + MARK
        + glob("numpy", "ndarray")
        + lit((0,))
        + lit(b"b")
        + TUPLE
        + REDUCE
    )
    state = (
        MARK + lit(1) + lit(tuple(shape)) + dtype_opcodes + lit(bool(fortran)) + lit(data) + TUPLE
    )
    return ops + state + BUILD


def scalar_ops(dtype_opcodes, data):
    return (
        glob("numpy.core.multiarray", "scalar") + MARK + dtype_opcodes + lit(data) + TUPLE + REDUCE
    )


def set_pickle(item_ops):
    """A pickle of set([items...]) where each item is pushed by the given opcodes."""
    items = b"".join(op + APPEND for op in item_ops)
    return b"\x80\x03" + glob("builtins", "set") + MARK + EMPTY_LIST + items + TUPLE + REDUCE + b"."


def sum_tree_pickle(level_ops, max_recorded_ops=None):
    """A Dopamine SumTree pickle whose `nodes` levels are pushed by `level_ops`."""
    nodes = EMPTY_LIST + b"".join(op + APPEND for op in level_ops)
    state = (
        EMPTY_DICT
        + lit("nodes")
        + nodes
        + SETITEM
        + lit("max_recorded_priority")
        + (max_recorded_ops or lit(1.0))
        + SETITEM
    )
    return (
        b"\x80\x03"
        + glob("dopamine.tf.replay_memory.sum_tree", "SumTree")
        + b")\x81"
        + state
        + BUILD
        + b"."
    )


def plain_level_ops(values):
    values = np.asarray(values, np.float64)
    return array_ops(values.shape, dtype_ops("f8", plain_dtype_state()), values.tobytes())


def sum_tree_levels(leaves):
    """Dopamine's levels (root first) of float64 `leaves` (a power of two long)."""
    levels = [np.asarray(leaves, np.float64)]
    with np.errstate(over="ignore"):  # huge leaves make infinite sums: loading ignores them
        while len(levels[0]) > 1:
            levels.insert(0, levels[0][0::2] + levels[0][1::2])
    return levels


def saved(buffer, directory, iteration=0):
    """Saves `buffer` into `directory` and returns {attribute: payload bytes}."""
    os.makedirs(str(directory), exist_ok=True)
    buffer.save(str(directory), iteration)
    return {
        name: read_payload(directory, name, iteration)
        for name in checkpoint.attribute_names(buffer)
    }


def saved_and_target(prioritized, directory):
    """A 23-row buffer, its checkpoint saved into `directory` ({attribute: payload bytes}), and
    another buffer (seed 1, 9 other rows) to load it into: (source, payloads, target)."""
    src = small_buffer(prioritized)
    fill(src, 23)
    good = saved(src, directory)
    target = small_buffer(prioritized, seed=1)
    fill(target, 9, start=200)
    return src, good, target
