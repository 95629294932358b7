"""The names of the chunk ingest's budgets for one actor's open episode (the chunks received
of the episode it is sending: ``cpp/core/chunk_ingest.h``), and the older spellings that
still work.

The older names said "stream", which memoire also uses for an actor's
:class:`memoire.experience.ChunkStream` and a learner's ``SamplingStream``; the ingest's
budgets are about open episodes, and say so.
"""

from __future__ import annotations

from typing import Dict

# older spelling -> name
OLDER_NAMES: Dict[str, str] = {
    "max_streams": "max_open_episodes",
    "stream_timeout": "open_episode_timeout",
    "max_stream_bytes": "max_episode_bytes",
}


def current_names(limits: Dict[str, object]) -> Dict[str, object]:
    """``limits`` with every older spelling replaced by its name (the values unchanged).

    Raises:
      TypeError: a budget given under both names.
    """
    out = dict(limits)
    for old, new in OLDER_NAMES.items():
        if old in out:
            if new in out:
                raise TypeError(f"{new}: given twice (also as its older name {old!r})")
            out[new] = out.pop(old)
    return out
