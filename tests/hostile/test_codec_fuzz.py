"""Fuzzing the codec: random values round-trip; random and mutated frames are decoded or
rejected with ProtocolError, never anything else; a live server survives thousands of them."""

import random

import numpy as np
import zmq
from _golden_frames import GOLDEN, assert_same, read_frames
from _waiting import wait_until
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from memoire import ReplayMemoryClient, ReplayMemoryServer, codec
from memoire.codec import Msg, ProtocolError

DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
]

arrays = st.sampled_from(DTYPES).flatmap(
    lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
)
leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=40)
    | arrays
)
values = st.recursive(
    leaves,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.lists(kids, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(max_size=10), values, max_size=5), st.integers(0, 255))
def test_random_values_round_trip(vals, flags):
    frames = codec.encode(Msg.CALL, vals, flags)
    m = codec.decode([memoryview(f).tobytes() for f in frames])
    assert m.type == Msg.CALL and m.flags == flags
    assert_same({k: _canon(v) for k, v in vals.items()}, m.values)


def _canon(v):
    """What a value decodes to: numpy scalars for 0-d arrays, bytes for binary."""
    if isinstance(v, np.ndarray) and v.ndim == 0:
        return v[()]
    if isinstance(v, dict):
        return {k: _canon(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_canon(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_canon(x) for x in v)
    return v


GOLDEN_FRAMES = [read_frames(p) for p in sorted(GOLDEN.glob("*.bin"))]


def mutate(rng: random.Random, frames):
    frames = [bytearray(f) for f in frames]
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        i = rng.randrange(len(frames))
        f = frames[i]
        if op == 0 and f:  # flip a byte
            f[rng.randrange(len(f))] = rng.randrange(256)
        elif op == 1:  # truncate a frame
            del f[rng.randrange(len(f) + 1) :]
        elif op == 2:  # grow a frame
            f.extend(rng.randbytes(rng.randint(1, 16)))
        elif op == 3 and len(frames) > 1:  # drop a frame
            del frames[i]
        elif op == 4:  # duplicate a frame
            frames.insert(i, bytearray(f))
        elif op == 5 and len(f) >= 24:  # a header integer set to an extreme
            off = rng.choice([8, 12, 16, 24, 25, 26, 27])
            f[off : off + 4] = rng.choice(
                [b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\xff\xff\xff\x7f"]
            )
    return [bytes(f) for f in frames]


@settings(max_examples=2500, deadline=None)
@given(st.integers(0, len(GOLDEN_FRAMES) - 1), st.integers(0, 2**32))
@example(5, 10488)  # once raised UnicodeDecodeError: the error text quoted invalid UTF-8
def test_mutated_golden_messages_decode_or_raise_protocol_error(which, seed):
    frames = mutate(random.Random(seed), GOLDEN_FRAMES[which])
    try:
        codec.decode(frames)
    except ProtocolError:
        pass


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=0, max_size=5))
def test_random_frames_decode_or_raise_protocol_error(frames):
    try:
        codec.decode(frames)
    except ProtocolError:
        pass


TEMPLATES = (
    np.zeros([4], np.float32),
    np.zeros([], np.int64),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([0], np.uint8),
)


def test_live_server_survives_thousands_of_bad_messages():
    rng = random.Random(0)
    with ReplayMemoryServer(*TEMPLATES, 1000, "tcp://127.0.0.1:*", 4) as srv:
        srv.rem.cache_size = 4
        ep = srv.start()
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.linger = 0
        push.connect(ep["pull"])
        req = ctx.socket(zmq.REQ)
        req.linger = 0
        req.connect(ep["rep"])
        n_pull = n_rep = 0
        for k in range(3000):
            frames = mutate(rng, rng.choice(GOLDEN_FRAMES))
            if k % 10 == 0:  # the REP worker must answer each one
                req.send_multipart(frames)
                assert req.poll(5000), "the REP worker stopped answering"
                reply = codec.decode(req.recv_multipart())
                assert reply.type in (Msg.ERROR, Msg.HELLO_REPLY, Msg.COUNTER_REPLY, Msg.CALL_REPLY)
                n_rep += 1
            else:
                push.send_multipart(frames)
                n_pull += 1
        # The workers still serve real clients, and nothing bad was stored.
        client = ReplayMemoryClient(ep["pub"], ep["rep"], ep["pull"], timeout=5)
        client.rem.new_episode()
        for k in range(6):
            client.rem.add_entry(np.zeros(4, np.float32), k, 1.0, 0.1, 0.0)
        client.rem.close_episode()
        assert client.push_cache() == 0

        def settled():
            stats = srv.stats()
            return (
                stats.get("caches", 0) >= 1
                and stats["rejected_total"] + stats.get("logs", 0) + n_rep >= 3000 - 10
            ) and stats

        stats = wait_until(settled, "the fuzzed messages counted")
        assert stats["rejected_total"] > 2000
        assert stats.get("caches", 0) == 1 and stats["memory_size"] == 0
        batch = srv.get_batch(4)
        assert np.isfinite(batch.weight).all()
        client.close()
        push.close()
        req.close()
        ctx.term()
