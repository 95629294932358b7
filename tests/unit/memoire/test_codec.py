"""memoire.codec: round trips, the committed version-1 golden messages, and clear errors."""

import struct
import sys
import types

import numpy as np
import pytest
from _golden_frames import GOLDEN, assert_same, read_frames, write_frames

from memoire import codec
from memoire.codec import Msg, ProtocolError


def golden_messages():
    """The messages whose version-1 bytes are committed under tests/data/wire_v1/."""
    return {
        "hello": (Msg.HELLO, 0, {"uuid": 0x1234ABCD}),
        "counter": (Msg.COUNTER, 0, {"uuid": 7, "episodes": 3, "steps": 1200}),
        "cache": (
            Msg.CACHE,
            0,
            {
                "prev/s": np.arange(2 * 1 * 3, dtype=np.uint8).reshape(2, 1, 3),
                "weight": np.array([0.5, 2.0], np.float32),
                "done": np.array([False, True]),
                "uuid": np.uint64(99),
                "total_weight": np.float64(3.25),
            },
        ),
        "chunk": (
            Msg.CHUNK,
            1 | 2,
            {
                "s": np.array([[1.0, -2.0], [3.5, 4.0]], np.float32),
                "init_w": np.ones(2, np.float32),
                "episode": np.int64(5),
                "index": np.int64(0),
            },
        ),
        "call": (
            Msg.CALL,
            0,
            {
                "object": "replay",
                "method": "add",
                "args": (1, 2.5, "x", None),
                "kwargs": {"flag": True, "raw": b"\x00\xff", "a": np.array([[1, 2]], np.int16)},
            },
        ),
        "log": (Msg.LOG, 0, {"uuid": 1, "message": "épisode 3 done"}),
    }


@pytest.mark.parametrize("name", sorted(golden_messages()))
def test_golden_v1_bytes_are_stable(name):
    msg_type, flags, values = golden_messages()[name]
    frames = [memoryview(f).tobytes() for f in codec.encode(msg_type, values, flags)]
    assert frames == read_frames(GOLDEN / f"{name}.bin")
    decoded = codec.decode(read_frames(GOLDEN / f"{name}.bin"))
    assert decoded.type == msg_type and decoded.flags == flags
    assert_same(values, decoded.values)


def test_header_layout_is_little_endian_and_documented():
    header = codec.encode(Msg.COUNTER, {"x": 1}, flags=7)[0]
    magic, version, mtype, flags, n, table, payload = struct.unpack_from("<4sHBBIIQ", header)
    assert (magic, version, mtype, flags, n, payload) == (b"MMRW", 1, Msg.COUNTER, 7, 1, 8)
    assert table == len(header) - 24


def test_arrays_come_back_as_views_or_copies():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]  # not contiguous
    frames = codec.encode(Msg.CACHE, {"a": a, "big": np.arange(4, dtype=">i4")})
    m = codec.decode(frames)
    assert np.array_equal(m["a"], a) and not m["a"].flags.writeable
    assert m["big"].dtype == np.dtype("<i4") and list(m["big"]) == [0, 1, 2, 3]
    w = codec.decode(frames, writable=True)
    w["a"][0, 0] = 42  # a private copy
    assert m["a"][0, 0] == 0


@pytest.mark.parametrize(
    "bad, what",
    [
        (np.array(["x"]), "dtype"),
        (np.array([1 + 2j]), "dtype"),
        ({1: 2}, "keys"),
        (object(), "object"),
        (2**70, "int"),
    ],
)
def test_unencodable_values_raise_clearly(bad, what):
    with pytest.raises((ValueError, OverflowError), match=what if what != "int" else None):
        codec.encode(Msg.CALL, {"v": bad})


def test_wrong_version_is_named():
    frames = codec.encode(Msg.HELLO, {"uuid": 1}, version=2)
    assert codec.peek_version(frames[0]) == 2
    with pytest.raises(ProtocolError, match="version 2"):
        codec.decode(frames)


def test_spec_mismatch_and_limits():
    frames = codec.encode(
        Msg.CACHE, {"w": np.zeros(8, np.float32), "x": np.zeros((8, 3), np.uint8)}
    )
    spec = codec.Spec({"w": (np.float32, (-1,)), "x": (np.uint8, (-1, 3))})
    assert codec.decode(frames, spec=spec).batch == 8
    with pytest.raises(ProtocolError, match="expected uint8"):
        codec.decode(frames, spec=codec.Spec({"w": (np.float32, (-1,)), "x": (np.uint8, (-1, 4))}))
    with pytest.raises(ProtocolError, match="missing"):
        codec.decode(frames, spec=codec.Spec({"y": (np.float32, (-1,))}, allow_extra=True))
    with pytest.raises(ProtocolError, match="limit"):
        codec.decode(frames, max_bytes=16)
    with pytest.raises(ProtocolError, match="unexpected message type"):
        codec.decode(frames, expect=(Msg.CHUNK,))
    with pytest.raises(ProtocolError, match="frame"):
        codec.decode(frames[:-1])
    with pytest.raises(ProtocolError):
        codec.decode([])


if __name__ == "__main__" and sys.argv[1:] == ["--regen"]:  # only when the format changes
    for name, (t, fl, vals) in golden_messages().items():
        write_frames(GOLDEN / f"{name}.bin", codec.encode(t, vals, fl))


def _frame_bytes(frames):
    return [
        np.ascontiguousarray(f).tobytes() if isinstance(f, np.ndarray) else bytes(f) for f in frames
    ]


def test_flat_arrays_take_the_native_header_path_with_identical_bytes():
    values = {
        "s": np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
        "w": np.array(1.5, np.float32),
        "d": np.array([True, False]),
        "e": np.zeros((0, 3), np.int64),
        "h": np.ones(2, np.float16),
    }
    fast = codec.encode(Msg.CACHE, values, flags=3)
    general = codec.encode(Msg.CACHE, types.MappingProxyType(values), flags=3)  # not a dict
    assert fast[1] is values["s"]  # the arrays themselves are the data frames
    assert _frame_bytes(fast) == _frame_bytes(general)
    got = codec.decode(fast)
    assert got.flags == 3 and got["w"] == np.float32(1.5) and got["e"].shape == (0, 3)
    np.testing.assert_array_equal(got["s"], values["s"])


def test_flat_encoder_leaves_other_values_to_the_general_path():
    big = np.arange(3, dtype=">i4")  # big-endian: converted by the general path
    strided = np.arange(10, dtype=np.int32)[::2]
    frames = codec.encode(Msg.CACHE, {"b": big, "t": strided, "n": 7})
    got = codec.decode(frames)
    np.testing.assert_array_equal(got["b"], [0, 1, 2])
    np.testing.assert_array_equal(got["t"], [0, 2, 4, 6, 8])
    assert got["n"] == 7
    with pytest.raises(ValueError, match="complex"):
        codec.encode(Msg.CACHE, {"c": np.zeros(2, np.complex64)})


def test_flat_frames_of_any_shape_travel_through_pyzmq():
    import zmq

    values = {
        "empty": np.zeros((0, 0), np.bool_),
        "m": np.arange(6, dtype=np.int16).reshape(2, 3),
        "x": np.array(1.5),
    }
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://codec-shapes")
    b.connect("inproc://codec-shapes")
    try:
        a.send_multipart(codec.encode(Msg.CALL, values), copy=False)
        assert b.poll(5000)
        got = codec.decode(b.recv_multipart(copy=False))
    finally:
        a.close(0)
        b.close(0)
        ctx.term()
    assert got["empty"].shape == (0, 0) and got["x"] == 1.5
    np.testing.assert_array_equal(got["m"], values["m"])


def test_strided_buffers_are_copied_or_refused():
    """Only C-contiguous bytes are read: codec.decode/encode copy a strided (e.g. reversed)
    buffer into its logical order; the native header decoder refuses one with a clear
    ValueError (it used to read from the view's first element onwards, past its memory)."""
    data = np.arange(6, dtype=np.int64)
    header, frame = codec.encode(Msg.CHUNK, {"a": data})
    header = np.frombuffer(bytes(header), np.uint8)
    every_other = np.repeat(header, 2)[::2]  # stride 2, same logical bytes
    assert not every_other.flags.c_contiguous
    spaced = np.zeros(12, np.int64)
    spaced[::2] = data
    got = codec.decode([memoryview(every_other), memoryview(spaced[::2])])
    np.testing.assert_array_equal(got["a"], data)
    got = codec.decode([header, memoryview(data[::-1])])
    np.testing.assert_array_equal(got["a"], data[::-1])
    with pytest.raises(ProtocolError):  # reversed header bytes: a bad magic, read in bounds
        codec.decode([header[::-1], frame])
    for native in (
        lambda h: codec._core.decode_header(h, [data.nbytes], 1 << 20),
        codec._core.peek_header,
    ):
        with pytest.raises(ValueError, match="C-contiguous"):
            native(header[::-1])
        with pytest.raises(ValueError, match="C-contiguous"):
            native(memoryview(every_other))
    sent = codec.encode(Msg.CALL, {"b": memoryview(np.arange(5, dtype=np.uint8)[::-1])})
    assert codec.decode(sent)["b"] == bytes([4, 3, 2, 1, 0])
