"""The learner's closing line: what its actors' experience came to, in labelled figures."""

from __future__ import annotations

from typing import Optional


def experience_summary(
    counters: dict, row_offsets: dict, refused: Optional[int] = None, actors: str = ""
) -> str:
    """The learner's closing line: what its actors' experience came to, in labelled figures.

    Args:
      counters: the chunk ingest's counters (``chunks``, ``keepalives``, ``rejected`` by reason).
      row_offsets: {stored rows minus the actor's steps: episodes} (one value when every episode
        was stored whole; Dopamine's JAX buffer stores as many rows as steps).
      refused: connections refused for their CURVE keys (None: the sockets have no keys).
      actors: what the launcher says of its actors (e.g. ``Ray actors: 8 placed, 1 lost, 1
        restarted``), or ''.

    E.g. ``experience: 41 episodes stored (rows = actor steps in each); 226 chunks and 12
    keepalives received, 3 rejected (peer_lost 3); CURVE: 0 connections refused``.
    """
    episodes = sum(row_offsets.values())

    def rows(offset: int) -> str:
        if not offset:
            return "rows = actor steps"
        return f"rows = actor steps {'+' if offset > 0 else '-'} {abs(offset)}"

    if len(row_offsets) == 1:
        stored = f"{episodes} episodes stored ({rows(next(iter(row_offsets)))} in each)"
    elif row_offsets:
        parts = ", ".join(f"{n} with {rows(k)}" for k, n in sorted(row_offsets.items()))
        stored = f"{episodes} episodes stored ({parts})"
    else:
        stored = "0 episodes stored"
    rejected = dict(counters.get("rejected", {}))
    reasons = (
        " (" + ", ".join(f"{k} {v}" for k, v in sorted(rejected.items())) + ")" if rejected else ""
    )
    text = (
        f"experience: {stored}; {counters.get('chunks', 0)} chunks and "
        f"{counters.get('keepalives', 0)} keepalives received, "
        f"{sum(rejected.values())} rejected{reasons}"
    )
    if refused is not None:
        text += f"; CURVE: {refused} connection(s) refused"
    return text + (f"; {actors}" if actors else "")
