"""ERROR replies of remote calls, fuzzed: whatever a server (or an impostor) answers, a caller
gets a clear exception (ProtocolError for a malformed reply, the mapped exception or
RemoteError for a well-formed ERROR), never a crash or an unrelated error. The sampling
stream's ERROR reader (core ReadErrorMessage) is fuzzed in cpp/tests/error_message_test.cc."""

from __future__ import annotations

import numpy as np
import pytest

from memoire import codec
from memoire.codec import Msg, ProtocolError
from memoire.remote import RemoteError, request

WEIRD = [
    None,
    3,
    2.5,
    True,
    b"\xff\xfe",
    "",
    "x" * 5000,
    [1, "a", None],
    ("KeyError", "why"),
    {"error": "ValueError"},
    np.arange(3),
    np.zeros((2, 0), np.float32),
    "ValueError",
    "KeyError",
    "NotAnException",
    "CapacityError",
]


class _Channel:
    """A request channel whose reply is given (no socket)."""

    endpoint = "tcp://127.0.0.1:1"
    max_bytes = 1 << 20

    def __init__(self, reply):
        self.reply = reply

    def request(self, frames):
        return self.reply


def _call(reply):
    return request(_Channel(reply), Msg.CALL, {"x": 1}, (Msg.CALL_REPLY,), "call")


@pytest.mark.parametrize("error", WEIRD)
@pytest.mark.parametrize("reason", [None, "because", [b"x"], {"a": 1}])
def test_error_replies_of_any_shape_raise_a_clear_exception(error, reason):
    frames = codec.encode(Msg.ERROR, {"error": error, "reason": reason})
    with pytest.raises(Exception) as got:
        _call(frames)
    assert isinstance(got.value, (RemoteError, ProtocolError, ValueError, KeyError, RuntimeError))
    assert "call" in str(got.value)


def test_corrupted_error_replies_are_refused_as_protocol_errors():
    rng = np.random.default_rng(24)
    good = codec.encode(Msg.ERROR, {"error": "ValueError", "reason": "r" * 40, "slot": 3})
    good = [bytes(memoryview(f).cast("B")) if not isinstance(f, bytes) else f for f in good]
    outcomes = {"protocol": 0, "mapped": 0}
    for _ in range(3000):
        frames = [bytearray(f) for f in good]
        h = frames[0]
        for _ in range(int(rng.integers(1, 5))):
            h[int(rng.integers(len(h)))] = int(rng.integers(256))
        if rng.integers(8) == 0:
            frames = frames[: int(rng.integers(len(frames) + 1))]
        if rng.integers(8) == 0 and len(frames) > 1:
            k = 1 + int(rng.integers(len(frames) - 1))
            frames[k] = frames[k][: int(rng.integers(len(frames[k]) + 1))]
        try:
            msg = _call([bytes(f) for f in frames])
        except ProtocolError as e:
            assert "call" in str(e)
            outcomes["protocol"] += 1
        except (RemoteError, ValueError, KeyError, RuntimeError) as e:
            assert "call" in str(e)
            outcomes["mapped"] += 1
        else:  # a flipped type byte can make a well-formed reply of the expected type
            assert msg.type == Msg.CALL_REPLY
    assert outcomes["protocol"] > 0 and outcomes["mapped"] > 0
