"""What memoire's messages carry (wire format version 1): the Python side of the protocol.

Every constant here comes from the C++ definition (``cpp/core/protocol.h``, exported as
``memoire._core.protocol``); this module only gives them Python shapes (tuples, a
:class:`memoire.codec.Spec`). The server and the client import them from here and restate none.

- :class:`Msg`, :class:`Kind`: the framing's message types and entry kinds (defined by the
  codec, ``cpp/core/codec.h``, and re-exported here).
- :data:`FIELDS`: the memory's fields (``s a r p v q i``).
- ``CHUNK_*``: flags of a CHUNK message; :data:`CHUNK_SCALARS`, :data:`CHUNK_INFO`: its
  entries besides the store's row columns (:data:`CHUNK_INIT_W`: a memory's last one);
  ``INGEST_*``: the chunk ingest's outcomes (``_core.ChunkIngest.ingest``);
  :data:`KEEPALIVE_SCALARS`: what a KEEPALIVE carries (the actor's uuid).
- :func:`cache_layout` / :func:`cache_spec`: the layout of a CACHE message.
- :data:`SETTINGS`: the memory settings a server sends in its handshake.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from memoire import _core, codec
from memoire.codec import WIRE_VERSION, Kind, Msg  # noqa: F401 - the framing's, re-exported

_P = _core.protocol

FIELDS: Tuple[str, ...] = tuple(_P.FIELDS)
QVEST: str = FIELDS[_P.QVEST_FIELD]  # computed by the receiving memory, never sent in a chunk

CHUNK_LAST: int = _P.CHUNK_LAST
CHUNK_TERMINAL: int = _P.CHUNK_TERMINAL
CHUNK_UPDATE_VALUE: int = _P.CHUNK_UPDATE_VALUE
CHUNK_UPDATE_WEIGHT: int = _P.CHUNK_UPDATE_WEIGHT
CHUNK_SCALARS: Tuple[Tuple[str, str], ...] = tuple(_P.CHUNK_SCALARS)  # (name, dtype name), 0-d
CHUNK_INFO: Tuple[str, str, int] = tuple(_P.CHUNK_INFO)  # (name, dtype name, size), optional
CHUNK_INIT_W: Tuple[str, str] = tuple(_P.MEMORY_INIT_W)  # a memory's row column after the fields
KEEPALIVE_SCALARS: Tuple[Tuple[str, str], ...] = tuple(_P.KEEPALIVE_SCALARS)  # (name, dtype), 0-d
INGEST_STAGED: int = _P.INGEST_STAGED
INGEST_COMMITTED: int = _P.INGEST_COMMITTED
INGEST_REJECTED: int = _P.INGEST_REJECTED
INGEST_KEEPALIVE: int = _P.INGEST_KEEPALIVE

CACHE_PREV: str = _P.CACHE_PREV
CACHE_NEXT: str = _P.CACHE_NEXT
CACHE_ROW_COLUMNS: Tuple[Tuple[str, str], ...] = tuple(_P.CACHE_ROW_COLUMNS)
CACHE_SCALARS: Tuple[Tuple[str, str], ...] = tuple(_P.CACHE_SCALARS)

# The memory settings a server sends in its handshake (attributes of memoire.ReplayMemory).
SETTINGS = (
    "priority_exponent",
    "priority_epsilon",
    "mix_lambda",
    "frame_stack",
    "multi_step",
    "cache_size",
    "max_episode",
    "reuse_cache",
    "discount_factor",
    "reward_coeff",
    "cache_flags",
)


def describe_schema(templates: Sequence[Any]) -> List[tuple]:
    """[(field, dtype name, shape)] of the seven buffer templates (s, a, r, p, v, q, i)."""
    out = []
    for f, t in zip(FIELDS, templates):
        t = np.asarray(t)
        out.append((f, t.dtype.name, tuple(int(d) for d in t.shape)))
    return out


def cache_layout(rem) -> tuple:
    """``(cache_size, frame_stack, cache_flags)`` of a :class:`memoire.ReplayMemory`: what the
    layout of its cache messages depends on, besides the schema (comparable, to notice a
    change)."""
    return (
        int(rem.cache_size),
        int(rem.frame_stack),
        tuple(np.asarray(rem.cache_flags, np.bool_).tolist()),
    )


def cache_spec(schema: Sequence[tuple], layout: tuple):
    """The :class:`memoire.codec.Spec` of a CACHE message for a schema (as
    :func:`describe_schema`) and a :func:`cache_layout`, in wire order: the stack columns
    ``prev/<field>`` and ``next/<field>`` the cache flags enable (``dtype[cache_size,
    frame_stack, *shape]``), the per-row columns (``[cache_size]``), then the 0-d values."""
    cs, fs, flags = layout
    arrays = {}
    for k, (name, dtype, shape) in enumerate(schema):
        if flags[k]:
            arrays[CACHE_PREV + name] = (dtype, (cs, fs) + tuple(shape))
        if flags[len(FIELDS) + k]:
            arrays[CACHE_NEXT + name] = (dtype, (cs, fs) + tuple(shape))
    arrays.update({name: (dtype, (cs,)) for name, dtype in CACHE_ROW_COLUMNS})
    arrays.update({name: (dtype, ()) for name, dtype in CACHE_SCALARS})
    return codec.Spec(arrays)
