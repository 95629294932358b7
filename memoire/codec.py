"""memoire's wire format (version 1): values to ZeroMQ frames and back, never pickle.

A message is a list of frames: one header frame (built and checked by the C++ codec,
``cpp/core/codec.h``, which documents the byte layout) and one raw data frame per array,
string or bytes value, in table order. Arrays go out as their own buffers (send them with
``copy=False``) and come back as read-only numpy views of the received frames.

Values a message may carry (top level: a mapping of names to values):

- ``numpy.ndarray`` of bool, int8..int64, uint8..uint64, float16/32/64 (any shape; sent
  little-endian and C-contiguous); a 0-d array or numpy scalar comes back as a numpy scalar.
- Python ``bool``, ``int`` (int64), ``float`` (float64): come back as the same Python type.
- ``str`` (UTF-8), ``bytes``/``bytearray``/``memoryview`` (come back as ``bytes``), ``None``.
- ``list``, ``tuple`` and ``dict`` (string keys) of the above, nested up to 32 levels.

Decoding checks every length, count, dtype code and shape against the frames (in C++) and
raises :class:`memoire.ProtocolError` (a ValueError) with the reason.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from memoire import _core
from memoire._core import ProtocolError

# The framing's constants, from the C++ definition (core/codec.h via memoire._core.protocol);
# memoire.protocol re-exports them beside what each message kind carries.
WIRE_VERSION: int = _core.protocol.WIRE_VERSION
Msg = enum.IntEnum("Msg", dict(_core.protocol.MSG_TYPES), module=__name__)
Msg.__doc__ = "Message types (``codec::MsgType``)."
Kind = enum.IntEnum("Kind", dict(_core.protocol.KINDS), module=__name__)
Kind.__doc__ = "Entry kinds of a header's table (``codec::Kind``)."

DEFAULT_MAX_BYTES = 1 << 32  # payload bytes a decoder accepts unless told otherwise

_DTYPES = [np.dtype(n) for n in _core.WIRE_DTYPES]
_CODE = {dt: code for code, dt in enumerate(_DTYPES)}
_EMPTY = b""


def dtype_code(dtype) -> int:
    """The wire code of a numpy dtype. Raises ValueError for unsupported dtypes."""
    dt = np.dtype(dtype)
    code = _CODE.get(dt.newbyteorder("=") if dt.byteorder == "<" else dt)
    if code is None:
        raise ValueError(
            f"dtype {dt} cannot travel on the wire (expected bool, int8..int64, "
            "uint8..uint64 or float16/32/64)"
        )
    return code


def _as_wire_array(a: np.ndarray) -> np.ndarray:
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a if a.flags.c_contiguous else a.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)


def _flatten(name: str, value: Any, entries: list, frames: list) -> None:
    """Appends `value` to the pre-order entry table (and its data frames)."""
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        a = _as_wire_array(np.asarray(value))
        entries.append((name, Kind.ARRAY, dtype_code(a.dtype), a.shape))
        frames.append(a.reshape(-1).view(np.uint8))  # flat bytes: any shape, zero-size too
    elif isinstance(value, bool):
        entries.append((name, Kind.SCALAR, _CODE[np.dtype(np.bool_)], ()))
        frames.append(np.array(value, np.bool_))
    elif isinstance(value, int):
        entries.append((name, Kind.SCALAR, _CODE[np.dtype(np.int64)], ()))
        frames.append(np.array(value, np.int64))  # OverflowError beyond int64
    elif isinstance(value, float):
        entries.append((name, Kind.SCALAR, _CODE[np.dtype(np.float64)], ()))
        frames.append(np.array(value, np.float64))
    elif isinstance(value, str):
        data = value.encode("utf-8")
        entries.append((name, Kind.STR, _CODE[np.dtype(np.uint8)], (len(data),)))
        frames.append(data)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = _contiguous(memoryview(value)).cast("B") if not isinstance(value, bytes) else value
        entries.append((name, Kind.BYTES, _CODE[np.dtype(np.uint8)], (len(data),)))
        frames.append(data)
    elif value is None:
        entries.append((name, Kind.NONE, 0, ()))
    elif isinstance(value, (list, tuple)):
        entries.append(
            (name, Kind.LIST if isinstance(value, list) else Kind.TUPLE, 0, (len(value),))
        )
        for item in value:
            _flatten("", item, entries, frames)
    elif isinstance(value, dict):
        entries.append((name, Kind.DICT, 0, (len(value),)))
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"dict keys must be str on the wire, got {type(key).__name__}")
            _flatten(key, item, entries, frames)
    else:
        raise ValueError(
            f"value of type {type(value).__name__} cannot travel on the wire "
            "(expected numpy arrays, bool, int, float, str, bytes, None, or "
            "lists, tuples and dicts of them)"
        )


def encode(
    msg_type: int, values: Mapping[str, Any], flags: int = 0, version: int = WIRE_VERSION
) -> List[Any]:
    """Frames of a message: ``[header, data...]``, to send with ``copy=False``.

    Args:
      msg_type: a :class:`Msg`.
      values: name -> value (see the module docstring for the types allowed).
      flags: 0..255, meaning per message type.
      version: the wire version written (tests use it to forge foreign messages).

    Raises:
      ValueError: a value that cannot be encoded (its type or dtype named).
    """
    if version == WIRE_VERSION and isinstance(values, dict):
        header = _core.encode_flat(int(msg_type), int(flags), values)  # numpy arrays only
        if header is not None:
            return [header, *values.values()]
    entries: list = []
    frames: list = []
    for name, value in values.items():
        _flatten(name, value, entries, frames)
    header = _core.encode_header(int(msg_type), int(flags), entries, int(version))
    return [header] + frames


def _contiguous(buf: memoryview) -> memoryview:
    """``buf``, or a C-contiguous copy of its bytes (in logical order) when it is strided: the
    native codec and ``np.frombuffer`` read a buffer's bytes from its start, which for a strided
    view (a reversed array, say) are not its elements."""
    return buf if buf.c_contiguous else memoryview(buf.tobytes())


def _buffer(frame) -> memoryview:
    if hasattr(frame, "buffer"):  # zmq.Frame received with copy=False
        return _contiguous(frame.buffer)
    return _contiguous(memoryview(frame))


@dataclasses.dataclass
class Message:
    """A decoded message: ``type`` (:class:`Msg`), ``flags`` and ``values`` (name -> value)."""

    type: int
    flags: int
    values: Dict[str, Any]
    batch: int = -1  # the -1 dimension agreed by the spec check, when a spec was given

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


def _array(buf: memoryview, dtype: int, shape: tuple, writable: bool):
    a = np.frombuffer(buf, dtype=_DTYPES[dtype]).reshape(shape)
    if writable:
        a = a.copy()
    elif a.flags.writeable:
        a.flags.writeable = False  # a view of a received frame: never write through it
    return a[()] if a.ndim == 0 else a


def _value(kind: int, dtype: int, shape: tuple, buf: Optional[memoryview], writable: bool):
    if kind == Kind.ARRAY:
        return _array(buf, dtype, shape, writable)
    if kind == Kind.SCALAR:
        return np.frombuffer(buf, dtype=_DTYPES[dtype])[0].item()
    if kind == Kind.STR:
        try:
            return bytes(buf).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProtocolError(f"a str entry is not valid UTF-8: {e}") from None
    if kind == Kind.BYTES:
        return bytes(buf)
    return None


def decode(
    frames: Sequence[Any],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    spec: Union[None, "Spec", Mapping[int, "Spec"]] = None,
    expect: Optional[Sequence[int]] = None,
    writable: bool = False,
) -> Message:
    """Decodes and checks the frames of one message.

    Args:
      frames: ``[header, data...]`` as bytes or ``zmq.Frame`` (``recv_multipart(copy=False)``).
      max_bytes: the most payload bytes accepted.
      spec: checks the top-level arrays (names, dtypes, shapes) against a :class:`Spec`, or
        against the Spec of the message's type when given a mapping ``{Msg: Spec}`` (types
        not in the mapping are not checked).
      expect: message types accepted; anything else raises.
      writable: copy arrays out of the frames (else they are read-only views).

    Raises:
      ProtocolError: the message is malformed, truncated, oversized, of another wire version,
        of an unexpected type, or does not match `spec`.
    """
    if not frames:
        raise ProtocolError("empty message (no header frame)")
    bufs = [_buffer(f) for f in frames]
    wire = _core.decode_header(bufs[0], [b.nbytes for b in bufs[1:]], int(max_bytes))
    if expect is not None and wire.type not in expect:
        raise ProtocolError(
            f"unexpected message type {Msg(wire.type).name.lower()}, expected "
            + " or ".join(Msg(t).name.lower() for t in expect)
        )
    if isinstance(spec, Mapping):
        spec = spec.get(wire.type)
    batch = wire.check(spec._native) if spec is not None else -1
    entries = wire.entries
    root: Dict[str, Any] = {}
    if all(e[1] <= Kind.SCALAR for e in entries):  # flat (the hot messages): no recursion
        for name, kind, dtype, shape, frame, _ in entries:
            buf = bufs[1 + frame]
            if kind == Kind.SCALAR:
                root[name] = np.frombuffer(buf, dtype=_DTYPES[dtype])[0].item()
            else:
                root[name] = _array(buf, dtype, shape, writable)
    else:
        i = 0
        while i < len(entries):
            name = entries[i][0]
            root[name], i = _build(entries, bufs, i, writable)
    return Message(Msg(wire.type), wire.flags, root, batch)


def _build(entries: list, bufs: list, i: int, writable: bool):
    """(value of the subtree at entries[i], index after it). The C++ check has already proved
    the table a well-formed forest of depth <= 32, so this recursion is bounded."""
    _, kind, dtype, shape, frame, _ = entries[i]
    i += 1
    if kind == Kind.DICT:
        d: Dict[str, Any] = {}
        for _ in range(shape[0]):
            key = entries[i][0]
            d[key], i = _build(entries, bufs, i, writable)
        return d, i
    if kind in (Kind.LIST, Kind.TUPLE):
        items = []
        for _ in range(shape[0]):
            item, i = _build(entries, bufs, i, writable)
            items.append(item)
        return (tuple(items) if kind == Kind.TUPLE else items), i
    return _value(kind, dtype, shape, bufs[1 + frame] if frame >= 0 else None, writable), i


def peek_version(frame) -> Optional[int]:
    """The wire version of a header frame, or None when it is not a memoire header."""
    got = _core.peek_header(_buffer(frame))
    return None if got is None else got[0]


class Spec:
    """Expected top-level arrays of a message: ``{name: (dtype, shape)}``; a dimension of -1
    matches any size, the same for all -1 dimensions (the batch size). ``optional`` names may
    be absent; ``allow_extra`` accepts other entries (not checked)."""

    def __init__(
        self, arrays: Mapping[str, tuple], optional: Sequence[str] = (), allow_extra: bool = False
    ):
        self.arrays = dict(arrays)
        self._native = _core.WireSpec(
            [
                (name, dtype_code(dt), [int(d) for d in shape], name in optional)
                for name, (dt, shape) in self.arrays.items()
            ],
            allow_extra,
        )

    def header(self, msg_type: int, flags: int = 0) -> bytes:
        """The header frame of a message carrying exactly these arrays, in this order (every
        dimension known: no -1), for senders that write the data frames themselves."""
        return _core.encode_header(
            int(msg_type),
            int(flags),
            [
                (name, Kind.ARRAY, dtype_code(dt), [int(d) for d in shape])
                for name, (dt, shape) in self.arrays.items()
            ],
        )
