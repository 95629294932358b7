"""The checkpoints of the JAX face: Dopamine's orbax files, decoded strictly.

``ReplayBuffer.save``/``load`` use Dopamine's orbax ``CheckpointManager`` and msgpack
``CheckpointHandler`` (``dopamine/jax/checkpointers.py``) with the same state dict layout, so
either buffer loads the other's files. Loading never unpickles: the pickled tree definitions in
Dopamine's files are ignored and the element layout is checked instead. Here: the handler whose
restore decodes a file strictly (:class:`CheckedCheckpointHandler`: only arrays of plain numeric
dtypes, whose data is exactly their shape's bytes, and Dopamine's compressed stacks, checked
before they inflate) and its orbax arguments (:class:`ReplayCheckpointArgs`). What the decoded
state dict must hold is checked by ``ReplayBuffer.from_state_dict``.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
from typing import Any

import msgpack
import numpy as np
import snappy
from dopamine.jax import checkpointers as dopamine_checkpointers
from orbax import checkpoint as orbax

from memoire.checkpoint_io import CheckpointError, open_regular

_COMPRESSED_FIELDS = ("data", "shape", "dtype")
_MAX_NDIM = 32


def _plain_dtype(spelled, what: str) -> np.dtype:
    """The numpy dtype ``spelled`` names when it is a plain numeric one, else ValueError."""
    try:
        dtype = np.dtype(spelled)
    except TypeError:
        raise ValueError(f"{what}: unknown dtype {spelled!r}") from None
    if dtype.kind not in "biuf" or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"{what}: expected a plain numeric dtype, got {dtype}")
    return dtype


def _checked_shape(shape, what: str) -> tuple:
    if (
        not isinstance(shape, (list, tuple))
        or len(shape) > _MAX_NDIM
        or not all(type(d) is int and d >= 0 for d in shape)
    ):  # noqa: E721 (no bools)
        raise ValueError(f"{what}: bad shape {shape!r}")
    return tuple(shape)


def _nbytes(shape: tuple, dtype: np.dtype) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


def _snappy_length(data: bytes) -> int:
    """The uncompressed length a raw snappy stream declares (its leading varint)."""
    n = 0
    for i, b in enumerate(data[:5]):
        n |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return n
    raise ValueError("compressed stack: not a snappy stream")


def uncompress_checked(record: np.ndarray) -> np.ndarray:
    """Dopamine's ``elements.uncompress`` after checking the record: a 0-d structured array
    (data uint8[n], shape int32[k], dtype bytes) naming a plain numeric dtype, whose snappy
    stream declares exactly that shape's bytes (checked before inflating: nothing inflates to
    more than the record says, and the record says no more than the stack holds)."""
    if record.shape != () or record.dtype.names != _COMPRESSED_FIELDS:
        raise ValueError(
            "compressed stack: expected Dopamine's record (data, shape, dtype), got "
            f"{record.dtype}{list(record.shape)}"
        )
    try:
        spelled = record["dtype"].item().decode("ascii")
    except (AttributeError, UnicodeDecodeError):
        raise ValueError("compressed stack: dtype is not a dtype code") from None
    dtype = _plain_dtype(spelled, "compressed stack")
    shape = _checked_shape(
        [int(d) for d in np.asarray(record["shape"]).reshape(-1)], "compressed stack"
    )
    data = np.ascontiguousarray(record["data"]).reshape(-1).view(np.uint8).tobytes()
    nbytes = _nbytes(shape, dtype)
    if _snappy_length(data) != nbytes:
        raise ValueError(
            f"compressed stack: {dtype}{list(shape)} is {nbytes} bytes, the snappy "
            f"stream declares {_snappy_length(data)}"
        )
    return np.frombuffer(snappy.uncompress(data), dtype=dtype).reshape(shape)


def _compressed_descr_ok(descr) -> bool:
    """Whether ``descr`` is the layout of Dopamine's ``elements.compress`` records."""
    if not isinstance(descr, list) or len(descr) != 3:
        return False
    names = tuple(f[0] if isinstance(f, tuple) and f else None for f in descr)
    if names != _COMPRESSED_FIELDS:
        return False
    (_, data_t, data_shape), (_, shape_t, shape_shape), dtype_field = descr
    return (
        data_t == "|u1"
        and shape_t == "<i4"
        and len(dtype_field) == 2
        and isinstance(dtype_field[1], str)
        and dtype_field[1].startswith("|S")
        and dtype_field[1][2:].isdigit()
        and int(dtype_field[1][2:]) <= 16
        and isinstance(data_shape, tuple)
        and len(data_shape) == 1
        and isinstance(shape_shape, tuple)
        and len(shape_shape) == 1
        and 0 <= shape_shape[0] <= _MAX_NDIM
    )


def _decode_checked(obj: Any) -> Any:
    """msgpack object hook: Dopamine's ``serialization.decode`` for what a replay checkpoint
    holds, refusing anything else (ValueError): arrays of a plain numeric dtype, or of the
    compressed-stack record layout, whose data is exactly shape x itemsize bytes; long ints."""
    if isinstance(obj, dict) and "dtype" in obj and "shape" in obj and "data" in obj:
        spelled = obj["dtype"]
        if not isinstance(spelled, str) or len(spelled) > 512:
            raise ValueError("array: dtype is not a dtype literal")
        try:
            descr = ast.literal_eval(spelled)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"array: dtype {spelled[:64]!r} is not a literal") from None
        if isinstance(descr, str):
            dtype = _plain_dtype(descr, "array")
        elif _compressed_descr_ok(descr):
            dtype = np.dtype(descr)
        else:
            raise ValueError(f"array: expected a plain numeric dtype, got {spelled[:64]!r}")
        shape = _checked_shape(obj["shape"], "array")
        data = obj["data"]
        order = obj.get("order")
        if (
            not isinstance(data, bytes)
            or len(data) != _nbytes(shape, dtype)
            or order not in (None, "C", "F")
        ):
            raise ValueError(
                f"array {dtype}{list(shape)}: expected {_nbytes(shape, dtype)} data "
                f"bytes and order C or F"
            )
        return np.ndarray(shape=shape, dtype=dtype, buffer=data, order=order)
    if isinstance(obj, dict) and "integer" in obj:
        text = obj["integer"]
        if not isinstance(text, str) or len(text) > 64:  # a PCG64 state is 39 digits
            raise ValueError("long integer: expected at most 64 digits")
        return int(text)
    return obj


def _read_bytes(path) -> bytes:
    """The bytes of checkpoint file `path` (an epath); a local one is opened safely
    (:func:`memoire.checkpoint_io.open_regular`: no FIFO, device or symlink)."""
    if "://" in str(path):
        return path.read_bytes()
    with open_regular(str(path)) as f:
        return f.read()


class CheckedCheckpointHandler(dopamine_checkpointers.CheckpointHandler):
    """Dopamine's msgpack checkpoint handler (same files, same save) whose restore decodes
    strictly (:func:`_decode_checked`) and raises CheckpointError naming the file. Its orbax
    arguments are :class:`ReplayCheckpointArgs` (registered with orbax below), so orbax uses it
    through its current API; ``item`` keeps Dopamine's legacy calls working."""

    def save(self, directory, item=None, args=None):
        super().save(directory, args.item if args is not None else item)

    def restore(self, directory, item=None, args=None):
        if args is not None:
            item = args.item
        filename = directory / self._filename
        try:
            data = _read_bytes(filename)
        except CheckpointError:
            raise
        except OSError as e:  # as Dopamine's read_bytes would
            raise CheckpointError(
                f"{filename}: not a readable replay checkpoint ({type(e).__name__}: {e})"
            ) from e
        try:
            state_dict = msgpack.unpackb(
                data, object_hook=_decode_checked, raw=False, strict_map_key=False
            )
        except (ValueError, TypeError, KeyError, OverflowError, msgpack.UnpackException) as e:
            raise CheckpointError(
                f"{filename}: not a readable replay checkpoint ({type(e).__name__}: {e})"
            ) from None
        if item is None:
            return state_dict
        item = copy.deepcopy(item)
        item.from_state_dict(state_dict)
        return item


@orbax.args.register_with_handler(CheckedCheckpointHandler, for_save=True, for_restore=True)
@dataclasses.dataclass
class ReplayCheckpointArgs(orbax.args.CheckpointArgs):
    """orbax's arguments of the replay checkpoint handler: to save, the buffer (``item``); to
    restore, None (the state dict comes back) or a buffer to restore a copy of."""

    item: Any = None
