"""One protocol: what messages carry is defined once in C++ (cpp/core/protocol.h, codec.h) and
read by Python from the bindings (memoire.protocol); the server, the client, the codec and the
memory use those definitions."""

import dataclasses

import numpy as np
import pytest
import zmq

from memoire import _core, codec, memory, protocol
from memoire.client import cache_message
from memoire.memory import ReplayMemory
from memoire.server import CacheBatch
from memoire.transport import native_libzmq


def _memory():
    rem = ReplayMemory(
        np.zeros([2], np.uint8),
        np.zeros([], np.int64),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([0], np.uint8),
        32,
    )
    rem.cache_size = 3
    rem.new_episode()
    for k in range(6):
        rem.add_entry(np.full(2, k, np.uint8), k, 1.0, 0.5, 0.0, np.zeros(0, np.uint8))
    rem.close_episode()
    return rem


def test_python_names_the_native_constants():
    native = _core.protocol
    assert {m.name: int(m) for m in protocol.Msg} == dict(native.MSG_TYPES)
    assert {k.name: int(k) for k in protocol.Kind} == dict(native.KINDS)
    assert codec.Msg is protocol.Msg and codec.WIRE_VERSION == native.WIRE_VERSION == 1
    assert memory.FIELDS is protocol.FIELDS == ("s", "a", "r", "p", "v", "q", "i")
    flags = (
        protocol.CHUNK_LAST,
        protocol.CHUNK_TERMINAL,
        protocol.CHUNK_UPDATE_VALUE,
        protocol.CHUNK_UPDATE_WEIGHT,
    )
    assert sorted(flags) == [1, 2, 4, 8]  # distinct bits of the one flags byte
    # A CacheBatch carries each per-row column and 0-d value of a cache, by its wire name.
    names = {f.name for f in dataclasses.fields(CacheBatch)}
    assert {n for n, _ in protocol.CACHE_ROW_COLUMNS + protocol.CACHE_SCALARS} <= names


def test_every_message_type_travels_as_its_native_code():
    for t in protocol.Msg:
        header = codec.encode(t, {"x": 1})[0]
        assert _core.peek_header(header) == (1, int(t))


def _cache_spec(rem):
    layout = protocol.cache_layout(rem)
    schema = protocol.describe_schema(
        (
            rem.state_buf,
            rem.action_buf,
            rem.reward_buf,
            rem.prob_buf,
            rem.value_buf,
            rem.qvest_buf,
            rem.info_buf,
        )
    )
    return protocol.cache_spec(schema, layout)


def test_python_cache_messages_match_the_cache_spec():
    rem = _memory()
    spec = _cache_spec(rem)
    names = list(spec.arrays)
    assert names[:2] == ["prev/s", "next/s"] and names[-3:] == [
        "uuid",
        "num_sampleable",
        "total_weight",
    ]
    msg = codec.decode(cache_message(rem, 9), spec=spec)  # the Python encoder
    assert list(msg.values) == names and int(msg["uuid"]) == 9


def test_native_cache_messages_match_the_cache_spec():
    if not native_libzmq():
        pytest.skip("the native sender needs pyzmq's libzmq (MEMOIRE_NATIVE_ZMQ=0 or not found)")
    rem = _memory()
    spec = _cache_spec(rem)
    names = list(spec.arrays)
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        pull.bind("inproc://cache")
        push.connect("inproc://cache")
        assert rem._push_cache(push.underlying, spec.header(protocol.Msg.CACHE), 3, 9, 1000)
        assert pull.poll(10000)
        native = codec.decode(pull.recv_multipart(), spec=spec)
        assert list(native.values) == names and native.batch == -1
        assert native["prev/s"].shape == (3, 1, 2) and native["prob"].dtype == np.float64
    finally:
        pull.close(0)
        push.close(0)
        ctx.term()


def test_a_closing_chunk_is_committed_as_the_protocol_says():
    rem = ReplayMemory(
        np.zeros([2], np.uint8),
        np.zeros([], np.int64),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([], np.float32),
        np.zeros([0], np.uint8),
        32,
    )
    ingest = _core.ChunkIngest(rem)
    rows = {
        "s": np.zeros((2, 2), np.uint8),
        "a": np.zeros(2, np.int64),
        "r": np.ones(2, np.float32),
        "p": np.ones(2, np.float32),
        "v": np.zeros(2, np.float32),
        "i": np.zeros((2, 0), np.uint8),
    }
    init_w, dtype = protocol.CHUNK_INIT_W
    rows[init_w] = np.ones(2, dtype)
    meta = dict(zip((n for n, _ in protocol.CHUNK_SCALARS), (7, 1, 0, 1.0)))
    values = dict(rows, **{n: np.array(meta[n], d) for n, d in protocol.CHUNK_SCALARS})
    staged = ingest.ingest(codec.encode(protocol.Msg.CHUNK, values))
    assert staged[0] == protocol.INGEST_STAGED
    values["index"] = np.array(1, np.int64)
    done = ingest.ingest(
        codec.encode(
            protocol.Msg.CHUNK, values, flags=protocol.CHUNK_LAST | protocol.CHUNK_TERMINAL
        )
    )
    assert done[:2] == (protocol.INGEST_COMMITTED, 4) and rem.size == 4
    bad = ingest.ingest(codec.encode(protocol.Msg.CHUNK, dict(values, index=np.array(5))))
    assert bad[0] == protocol.INGEST_REJECTED
