"""Rate limiters with Reverb's semantics: a minimum size before the first sample, and a
samples-per-insert ratio held within an error margin.

Reverb (``reverb/rate_limiters.py``, ``SampleToInsertRatio``) describes its limiter in two
stages: while the table holds fewer than ``min_size_to_sample`` items "the limiter works exactly
like MinSize, i.e. it allows all insert calls and blocks all sample calls"; afterwards it
"attempts to maintain the ratio ``samples_per_inserts`` between the samples and inserts ... by
measuring the error in this ratio, calculated as
``(number_of_inserts - min_size_to_sample) * samples_per_insert - number_of_samples``. If this
quantity is within the range (-error_buffer, error_buffer) then no limiting occurs. If the error
is larger than error_buffer then insert calls will be blocked; sampling will be blocked for error
less than -error_buffer." Its C++ core (``reverb/cc/rate_limiter.cc``) decides with the cursor
``d = inserts * samples_per_insert - samples`` and the band
``[min_diff, max_diff] = offset -/+ error_buffer``, ``offset = samples_per_insert *
min_size_to_sample``: a sample of n proceeds when ``inserts >= min_size_to_sample`` and
``d - n >= min_diff``; an insert of n when ``inserts + n <= min_size_to_sample`` or
``(inserts + n) * samples_per_insert - samples <= max_diff``.

memoire counts in transitions on both sides: an insert is one stored transition (a whole
episode is stored at once, so the insert side may overshoot ``max_diff`` by one episode's
length times ``samples_per_insert``), a sample is one row of a batch (a batch of 32 counts 32,
and waits until all 32 fit). So ``samples_per_insert`` is the replay ratio: how many times each
stored transition is drawn over its life (DQN's batch 32 every 4 steps is 8).

The limiter itself is ``memoire._core.RateLimiter`` (``cpp/core/rate_limiter.h``): counting,
decision and condition variables in C++, every wait with the GIL released. Use it in-process
(``await_insert`` before you add, ``inserted(n)`` after, ``await_sample(batch)`` before you
sample) or give it to :class:`memoire.ReplayMemoryServer` (``rate_limiter=``), whose ingest
stops pulling from its socket while inserts are blocked (ZeroMQ's high-water marks then hold
the actors back: nothing is dropped) and whose ``sample`` waits, locally or for a remote learner
(the reply is deferred; the server keeps serving other peers).
"""

from __future__ import annotations

import logging
import math
from typing import Optional, Tuple, Union

from memoire import _core

log = logging.getLogger(__name__)

RateLimiter = _core.RateLimiter
DEFAULT_TIMEOUT = 2.0  # seconds a sample waits for the limiter unless told otherwise


def SampleToInsertRatio(
    samples_per_insert: float,
    min_size_to_sample: int,  # noqa: N802
    error_buffer: Union[float, Tuple[float, float]],
) -> RateLimiter:
    """A limiter that holds samples per insert near `samples_per_insert` (Reverb's
    ``SampleToInsertRatio``; see the module docstring).

    Args:
      samples_per_insert: times each stored transition is sampled over its life, > 0.
      min_size_to_sample: transitions stored before the first sample, >= 1.
      error_buffer: the margin: a number e gives the band ``offset -/+ e`` around
        ``offset = samples_per_insert * min_size_to_sample``; a pair ``(min_diff, max_diff)``
        is used as the band itself. The band must be at least ``2 * max(1,
        samples_per_insert)`` wide (Reverb's rule), and a batch of B can only be drawn when
        ``B <= max_diff - min_diff - samples_per_insert``.

    Raises:
      ValueError: a ratio that is not finite and > 0, ``min_size_to_sample < 1``, a band too
        narrow, or a band entirely above the offset (the first sample would wait for ever).
    """
    spi = float(samples_per_insert)
    if not (math.isfinite(spi) and spi > 0):
        raise ValueError(
            f"samples_per_insert: expected a finite ratio > 0, got {samples_per_insert}"
        )
    if int(min_size_to_sample) < 1:
        raise ValueError(f"min_size_to_sample: expected >= 1, got {min_size_to_sample}")
    offset = spi * int(min_size_to_sample)
    if isinstance(error_buffer, (int, float)):
        e = float(error_buffer)
        if not (e >= 0):
            raise ValueError(f"error_buffer: expected >= 0, got {error_buffer}")
        min_diff, max_diff = offset - e, offset + e
    else:
        min_diff, max_diff = (float(v) for v in error_buffer)
    if not (max_diff - min_diff >= 2 * max(1.0, spi)):
        raise ValueError(
            f"error_buffer: the band [{min_diff}, {max_diff}] must be at least "
            f"2 * max(1, samples_per_insert) = {2 * max(1.0, spi)} wide, or "
            "sampling and inserting could block each other for ever"
        )
    if min_diff > offset:
        raise ValueError(
            f"error_buffer: the band [{min_diff}, {max_diff}] lies above "
            f"samples_per_insert * min_size_to_sample = {offset}: the first "
            "sample would wait for ever"
        )
    if max_diff < offset:
        log.warning(
            "error_buffer: the band [%s, %s] lies below samples_per_insert * "
            "min_size_to_sample = %s: inserts block as soon as min_size_to_sample "
            "transitions are stored, until a sampler runs",
            min_diff,
            max_diff,
            offset,
        )
    return RateLimiter(spi, int(min_size_to_sample), min_diff, max_diff)


def MinSize(min_size_to_sample: int) -> RateLimiter:  # noqa: N802
    """A limiter that only blocks sampling until `min_size_to_sample` transitions are stored
    (Reverb's ``MinSize``); inserts never block."""
    if int(min_size_to_sample) < 1:
        raise ValueError(f"min_size_to_sample: expected >= 1, got {min_size_to_sample}")
    return RateLimiter(1.0, int(min_size_to_sample), -math.inf, math.inf)


def check_capacity(limiter: Optional[RateLimiter], capacity: int, what: str) -> None:
    """Refuses a limiter whose ``min_size_to_sample`` exceeds the `capacity` (transitions) of
    the memory it guards: sampling would never start.

    Raises:
      ValueError: naming `what` (the memory) and both numbers.
    """
    if limiter is not None and limiter.min_size_to_sample > int(capacity):
        raise ValueError(
            f"rate_limiter: min_size_to_sample={limiter.min_size_to_sample} is "
            f"more than {what} holds ({capacity} transitions): sampling would "
            "never start"
        )
