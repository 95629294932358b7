"""The committed version-1 golden messages (tests/data/wire_v1/): their folder, the
file format of their frames (a little-endian uint32 count, then each frame as a
uint32 length and its bytes), and the bitwise comparison of decoded values, for
the codec's tests and its fuzz."""

import pathlib
import struct

import numpy as np

GOLDEN = pathlib.Path(__file__).parents[1] / "data" / "wire_v1"


def write_frames(path, frames):
    with open(path, "wb") as f:
        f.write(struct.pack("<I", len(frames)))
        for fr in frames:
            b = memoryview(fr).tobytes()
            f.write(struct.pack("<I", len(b)) + b)


def read_frames(path):
    data = path.read_bytes()
    (n,), off, frames = struct.unpack_from("<I", data), 4, []
    for _ in range(n):
        (size,) = struct.unpack_from("<I", data, off)
        frames.append(data[off + 4 : off + 4 + size])
        off += 4 + size
    return frames


def assert_same(a, b):
    if isinstance(a, np.ndarray) or isinstance(a, np.generic):
        assert type(a) is type(b) and a.dtype == b.dtype and np.shape(a) == np.shape(b)
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()  # bitwise: NaN == NaN
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert type(a) is type(b) and a == b
