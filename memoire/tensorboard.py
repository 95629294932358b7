"""TensorBoard scalars without TensorFlow: a small event-file writer (and reader).

TensorBoard reads ``events.out.tfevents.*`` files: a sequence of TFRecords, each one
serialized ``Event`` protocol buffer. This module writes the few fields scalars need, encoded
by hand, so ``memoire serve --tensorboard DIR`` and code without TensorFlow can publish
figures TensorBoard shows (``tensorboard --logdir DIR``)::

    with SummaryWriter("runs/a") as w:
        w.scalars(step=10, values={"replay/size": 512, "replay/inserts_per_s": 2e3})

Record framing (TFRecord, all little-endian)::

    uint64 length | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)

Fields written (tensorflow/core/util/event.proto, tensorflow/core/framework/summary.proto)::

    Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
              Summary summary = 5; }
    Summary { repeated Value value = 1; }
    Value   { string tag = 1; float simple_value = 2; }

A file starts with an Event holding ``file_version = "brain.Event:2"``; each
:meth:`SummaryWriter.scalars` call writes one Event with one Value per tag. ``simple_value``
is a float32, so values are rounded to float32 (what TensorBoard's own scalars hold too).

:func:`read_scalars` reads such files back (checking every CRC), for tests and for scripts
without TensorBoard installed.
"""

from __future__ import annotations

import glob
import itertools
import math
import os
import socket
import struct
import threading
import time
from typing import BinaryIO, Dict, Iterator, List, Mapping, NamedTuple, Optional, Tuple

FILE_VERSION = "brain.Event:2"
FILE_PREFIX = "events.out.tfevents."


# ---------------------------------------------------------------------------------------------
# CRC32C (Castagnoli), as TFRecord frames use it.


def _crc32c_table() -> Tuple[int, ...]:
    poly = 0x82F63B78  # reflected Castagnoli polynomial
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """The CRC32C of ``data`` (uint32). Table-driven, one Python step per byte: meant for the
    few hundred bytes of an event, not for bulk data."""
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: the CRC32C rotated right by 15 bits plus 0xa282ead8 (uint32)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """``data`` framed as one TFRecord."""
    length = struct.pack("<Q", len(data))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


# ---------------------------------------------------------------------------------------------
# Protocol buffer encoding of the few fields used.


def _varint(n: int) -> bytes:
    n &= 0xFFFFFFFFFFFFFFFF  # int64: negative numbers take ten bytes, as protobuf writes them
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint((field << 3) | wire_type)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def encode_event(
    wall_time: float,
    step: int = 0,
    *,
    file_version: Optional[str] = None,
    scalars: Optional[Mapping[str, float]] = None,
) -> bytes:
    """One serialized ``Event``: ``wall_time`` (seconds since the epoch, float64), ``step``
    (int64), and either ``file_version`` or a summary of ``scalars`` (tag -> value, written as
    float32 ``simple_value``, in the mapping's order)."""
    out = _key(1, 1) + struct.pack("<d", float(wall_time))
    if step:
        out += _key(2, 0) + _varint(int(step))
    if file_version is not None:
        out += _length_delimited(3, file_version.encode())
    if scalars:
        summary = b"".join(
            _length_delimited(
                1,
                _length_delimited(1, str(tag).encode())
                + _key(2, 5)
                + struct.pack("<f", float(value)),
            )
            for tag, value in scalars.items()
        )
        out += _length_delimited(5, summary)
    return out


# ---------------------------------------------------------------------------------------------
# Writer.

_file_counter = itertools.count()


class SummaryWriter:
    """Writes scalars to a new event file in ``logdir`` (made if missing).

    Args:
      logdir: the run's directory, as ``tensorboard --logdir`` shows it.
      filename_suffix: appended to the file name (``events.out.tfevents.<time>.<host>.<pid>.<n>``).

    Raises:
      ValueError: ``logdir`` is empty, is (or lies under) a file, or cannot be written; nothing
        is created then.

    Thread-safe: one lock serializes the writes. Each write reaches the OS at once (the file is
    flushed after every event), so a crash loses nothing written and TensorBoard sees new
    points while the program runs.
    """

    def __init__(self, logdir: str, filename_suffix: str = ""):
        self.logdir = check_logdir(logdir)
        os.makedirs(self.logdir, exist_ok=True)
        name = (
            f"{FILE_PREFIX}{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}."
            f"{next(_file_counter)}{filename_suffix}"
        )
        self.path = os.path.join(self.logdir, name)
        self._lock = threading.Lock()
        self._file: Optional[BinaryIO] = open(self.path, "wb")
        self._write(encode_event(time.time(), 0, file_version=FILE_VERSION))

    def _write(self, event: bytes) -> None:
        with self._lock:
            if self._file is None:
                raise ValueError(f"{self.path}: the writer is closed")
            self._file.write(frame_record(event))
            self._file.flush()

    def scalars(
        self, step: int, values: Mapping[str, float], wall_time: Optional[float] = None
    ) -> None:
        """Writes ``values`` (tag -> number) at ``step`` as one event.

        Args:
          step: the x axis (int64: an iteration, a count of seconds, ...).
          values: tag -> value; non-finite values are written as they are (TensorBoard shows
            NaN and inf).
          wall_time: seconds since the epoch; default now.

        Raises:
          TypeError: a value that is not a real number.
        """
        for tag, value in values.items():  # all checked before anything is written
            if not isinstance(tag, str) or not tag:
                raise TypeError(f"scalar tags are non-empty strings, got {tag!r}")
            try:
                if isinstance(value, (str, bytes)):
                    raise TypeError
                float(value)
            except (TypeError, ValueError):
                raise TypeError(f"scalar {tag!r}: expected a number, got {value!r}") from None
        self._write(
            encode_event(time.time() if wall_time is None else wall_time, step, scalars=values)
        )

    def scalar(self, tag: str, value: float, step: int, wall_time: Optional[float] = None) -> None:
        """Writes one value (see :meth:`scalars`)."""
        self.scalars(step, {tag: value}, wall_time)

    def flush(self) -> None:
        """Every write is flushed already; kept for the usual writer interface."""

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> "SummaryWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_logdir(logdir: str) -> str:
    """``logdir`` as an absolute path, checked (writing nothing) to be a directory that exists
    or can be made.

    Raises:
      ValueError: naming what is in the way (an empty path, a file, no permission).
    """
    if not logdir or not str(logdir).strip():
        raise ValueError("tensorboard: expected a directory, got an empty path")
    path = os.path.abspath(os.fspath(logdir))
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise ValueError(f"tensorboard: {probe!r} is a file; expected a directory for {path!r}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"tensorboard: cannot write in {probe!r} (permission denied)")
    return path


# ---------------------------------------------------------------------------------------------
# Reader.


class ScalarEvent(NamedTuple):
    wall_time: float
    step: int
    value: float


def _read_varint(buf: bytes, pos: int) -> Tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[Tuple[int, int, object]]:
    """(field, wire_type, value) of a serialized message; value: int, or bytes for fixed and
    length-delimited fields."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            n, pos = _read_varint(buf, pos)
            value, pos = buf[pos : pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield field, wire, value


def read_records(path: str) -> Iterator[bytes]:
    """The data of each TFRecord in ``path``.

    Raises:
      ValueError: a CRC that does not match, or a truncated record.
    """
    with open(path, "rb") as f:
        while True:
            head = f.read(12)
            if not head:
                return
            if len(head) < 12:
                raise ValueError(f"{path}: truncated record header")
            (length,), (crc,) = struct.unpack("<Q", head[:8]), struct.unpack("<I", head[8:])
            if crc != masked_crc32c(head[:8]):
                raise ValueError(f"{path}: bad length CRC")
            data, tail = f.read(length), f.read(4)
            if len(data) < length or len(tail) < 4:
                raise ValueError(f"{path}: truncated record")
            if struct.unpack("<I", tail)[0] != masked_crc32c(data):
                raise ValueError(f"{path}: bad data CRC")
            yield data


def read_scalars(path: str) -> Dict[str, List[ScalarEvent]]:
    """tag -> [(wall_time, step, value)] of every ``simple_value`` in an event file, or in
    every ``events.out.tfevents.*`` file of a directory (files in name order)."""
    files = (
        sorted(glob.glob(os.path.join(path, FILE_PREFIX + "*"))) if os.path.isdir(path) else [path]
    )
    out: Dict[str, List[ScalarEvent]] = {}
    for name in files:
        for record in read_records(name):
            wall_time, step, summary = math.nan, 0, None
            for field, wire, value in _fields(record):
                if field == 1 and wire == 1:
                    wall_time = struct.unpack("<d", value)[0]
                elif field == 2 and wire == 0:
                    step = value - (1 << 64) if value >= 1 << 63 else value
                elif field == 5 and wire == 2:
                    summary = value
            if summary is None:
                continue
            for field, wire, value in _fields(summary):
                if field != 1 or wire != 2:
                    continue
                tag, simple = None, None
                for f2, w2, v2 in _fields(value):
                    if f2 == 1 and w2 == 2:
                        tag = v2.decode()
                    elif f2 == 2 and w2 == 5:
                        simple = struct.unpack("<f", v2)[0]
                if tag is not None and simple is not None:
                    out.setdefault(tag, []).append(ScalarEvent(wall_time, step, simple))
    return out
