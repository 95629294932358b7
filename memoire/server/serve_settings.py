"""The settings of ``memoire serve``: one registry (:data:`SETTINGS`) that gives each setting
its default, type, help line, group in ``--help`` and metavar, and the readers that turn a
setting (a flag's string, or a gin value) into what a server takes.

Each setting NAME is the flag ``--NAME`` and the gin parameter ``serve_config.NAME``; a
settings dict (``cfg``, see :func:`serve_config`) holds every name. Builders of servers read
it: :func:`memoire.server.from_settings.build_server` (a ReplayMemoryServer) and
:func:`memoire.dopamine_compat.buffer_server_from_settings.build_buffer_server` (a Dopamine
buffer). Defaults that are the server's own are read from the constants the server uses,
never written here again.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

from memoire.server.central_service import DEFAULT_MAX_COUNTER_CLIENTS
from memoire.server.rpc_host import DEFAULT_MAX_BATCH, DEFAULT_REPLY_CACHE_BYTES
from memoire.server.sampling_service import default_stream_threads
from memoire.server.workers import DEFAULT_MAX_MESSAGE_BYTES
from memoire.transport import KEEPALIVE_S, PEER_TIMEOUT_S, RECEIVE_HWM, CurveKeys

MIN_SIZE_TO_SAMPLE = 1  # the rate limiter's minimum size when only the ratio is given


def _bytes(n: int) -> str:
    """``n`` bytes as help text shows them: ``64 MiB``, ``1 GiB``, ``4096 B``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting of ``memoire serve``: the option ``--NAME`` and the gin parameter
    ``serve_config.NAME``.

    Attributes:
      default: the value when neither a flag nor gin gives one (None: the server's own, or off).
      help: one short line for ``--help``; what a setting means at length is in the README and
        docs/LIMITS.md. A default that is the server's own is said here, read from its constant.
      type: what a flag's text becomes (``int``, ``float``, ``str``).
      metavar: its value in ``--help`` (None: ``N`` for an int, ``X`` otherwise).
      form: ``"value"``; ``"flag"``: 0 or 1, ``--NAME`` alone meaning 1 (:func:`read_flag`);
        ``"repeated"``: given once per item.
      aliases: other spellings of the option.
    """

    default: Any
    help: str
    type: Callable = str
    metavar: Optional[str] = None
    form: str = "value"
    aliases: Tuple[str, ...] = ()


# Every setting, by its group in --help, in the order --help shows them.
SETTINGS: Dict[str, Dict[str, Setting]] = {
    "the memory": dict(
        state_shape=Setting(
            "4", "state shape: comma-separated ints ('84,84'; '': scalar)", metavar="SHAPE"
        ),
        state_dtype=Setting("float32", "state dtype (numpy's name)", metavar="DTYPE"),
        action_shape=Setting("", "action shape", metavar="SHAPE"),
        action_dtype=Setting("int64", "action dtype", metavar="DTYPE"),
        reward_shape=Setting("", "shape of reward, value and qvest (float32)", metavar="SHAPE"),
        info_shape=Setting("0", "info shape ('0': no info)", metavar="SHAPE"),
        info_dtype=Setting("uint8", "info dtype", metavar="DTYPE"),
        max_step=Setting(1_000_000, "entries the memory holds", int),
        n_caches=Setting(64, "caches kept for get_batch (cache mode)", int),
        seed=Setting(None, "seed of the sampling", int),
        # ReplayMemory's compress_states.
        compress_states=Setting(
            None,
            "1 (or bare): states LZ4-compressed, read bit for bit (default 0)",
            metavar="0|1",
            form="flag",
        ),
    ),
    "endpoints and keys": dict(
        pub=Setting(
            "tcp://*:*", "PUB endpoint of the settings (port *: the OS's choice)", metavar="EP"
        ),
        rep=Setting("tcp://*:*", "REP endpoint of requests", metavar="EP", aliases=("--endpoint",)),
        pull=Setting("tcp://*:*", "PULL endpoint of caches and episode chunks", metavar="EP"),
        bind_host=Setting("127.0.0.1", "interface that '*' hosts bind to", metavar="HOST"),
        curve_secret=Setting(None, "the server's CURVE secret key file", metavar="FILE"),
        curve_authorized=Setting(None, "folder of the clients' CURVE public keys", metavar="DIR"),
        # The sampling stream's endpoint (memoire.stream.SamplingStream).
        stream=Setting(
            None, "endpoint of sampling streams (docs/STREAM.md; default: none)", metavar="EP"
        ),
        stream_threads=Setting(
            None, f"sampler threads per stream (default here: {default_stream_threads()})", int
        ),
    ),
    "settings sent to clients (default: the memory's)": dict(
        cache_size=Setting(None, "transitions per cache", int),
        frame_stack=Setting(None, "frames stacked per state", int),
        multi_step=Setting(None, "steps between prev and next", int),
        priority_exponent=Setting(None, "priority exponent", float),
        discount_factor=Setting(None, "discount factor", float),
    ),
    # memoire.rate_limiter (Reverb's semantics).
    "rate limiter (default: none)": dict(
        samples_per_insert=Setting(
            None, "transitions sampled per one stored (with --rate_error_buffer)", float
        ),
        min_size_to_sample=Setting(
            None, f"stored before the first sample (default {MIN_SIZE_TO_SAMPLE})", int
        ),
        rate_error_buffer=Setting(
            None, "half width of the band around the ratio, in samples", float
        ),
    ),
    "limits on what peers make the server hold (docs/LIMITS.md; bytes default from --max_step)": dict(
        max_stream_bytes=Setting(None, "bytes of one actor's unfinished episodes", int),
        max_open_bytes=Setting(None, "bytes of all unfinished episodes", int),
        reply_cache_bytes=Setting(
            None,
            f"bytes of replies kept for retried calls (default {_bytes(DEFAULT_REPLY_CACHE_BYTES)})",
            int,
        ),
        max_batch=Setting(
            None, f"rows of one remote sample call (default {DEFAULT_MAX_BATCH})", int
        ),
        max_counter_clients=Setting(
            None, f"clients whose counters are kept (default {DEFAULT_MAX_COUNTER_CLIENTS})", int
        ),
        allow_nonfinite=Setting(
            None,
            "1 (or bare): store NaN/inf r, p, v from peers (default 0)",
            metavar="0|1",
            form="flag",
        ),
        # Liveness and the receive queues' bytes.
        peer_timeout=Setting(
            None,
            "seconds of an actor's silence before its open episode is dropped "
            f"(default {PEER_TIMEOUT_S:g}; longer than clients' keepalive, {KEEPALIVE_S:g})",
            float,
            metavar="S",
        ),
        max_message_bytes=Setting(
            None,
            "bytes of a peer's largest message; receive queues hold "
            f"{RECEIVE_HWM} per connection (default {_bytes(DEFAULT_MAX_MESSAGE_BYTES)})",
            int,
        ),
    ),
    "checkpoints (--checkpoint_dir: the memory's, or the --buffer's)": dict(
        checkpoint_dir=Setting(
            None,
            "the newest is loaded at start; one is written on request, "
            "every --checkpoint_every s and at the stop; 3 are kept",
            metavar="DIR",
        ),
        checkpoint_every=Setting(None, "seconds between periodic checkpoints", float, metavar="S"),
    ),
    "output": dict(
        logfile=Setting(None, "append actors' log lines to this file", metavar="FILE"),
        logmode=Setting("a", "'a' appends to --logfile, 'w' truncates it", metavar="MODE"),
        interval=Setting(2.0, "seconds between counter lines", float, metavar="S"),
        duration=Setting(None, "stop after this many seconds (default: never)", float, metavar="S"),
        tensorboard=Setting(
            None, "also write the counters as TensorBoard scalars here", metavar="DIR"
        ),
    ),
    "a Dopamine buffer instead (--buffer)": dict(
        # memoire serve adds the kinds to the help (buffer_server.BUFFER_KINDS, a layer above).
        buffer=Setting(None, "the buffer's kind", metavar="KIND"),
        name=Setting("replay", "the name clients ask for (an agent's replay_name)", metavar="NAME"),
        arg=Setting(
            None,
            "a buffer argument as a Python literal (repeatable)",
            metavar="KEY=VALUE",
            form="repeated",
        ),
        checkpoint_root=Setting(
            ".", "folder remote save/load stay in ('none': refused)", metavar="DIR"
        ),
    ),
}

# Views of SETTINGS by name.
_ALL = {name: s for group in SETTINGS.values() for name, s in group.items()}
DEFAULTS = {name: s.default for name, s in _ALL.items()}
HELP = {name: s.help for name, s in _ALL.items()}
BOOLEAN_FLAGS = tuple(name for name, s in _ALL.items() if s.form == "flag")

# The limits a ReplayMemoryServer takes as keyword arguments of the same names.
LIMITS = (
    "max_stream_bytes",
    "max_open_bytes",
    "reply_cache_bytes",
    "max_batch",
    "max_counter_clients",
    "allow_nonfinite",
)


def serve_config(**overrides) -> dict:
    """The settings of ``memoire serve``: :data:`DEFAULTS` with ``overrides`` (gin-configurable
    as ``serve_config.NAME``).

    Raises:
      ValueError: a name that is not a setting.
    """
    cfg = dict(DEFAULTS)
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"serve: unknown settings {sorted(unknown)}")
    cfg.update(overrides)
    return cfg


def read_shape(text) -> tuple:
    """A shape setting (``'84,84'``; ``''``: a scalar) as a tuple of ints.

    Raises:
      ValueError: a part that is not an int.
    """
    text = str(text).strip()
    return tuple(int(x) for x in text.split(",") if x.strip()) if text else ()


def read_flag(value, name: str = "allow_nonfinite") -> Optional[bool]:
    """The 0/1 setting ``name`` as given by a flag (str) or gin (bool, int); None when not
    given.

    Raises:
      ValueError: anything but 0/1, true/false or yes/no.
    """
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("0", "1", "true", "false", "yes", "no"):
        raise ValueError(f"{name}: expected 0 or 1, got {value!r}")
    return text in ("1", "true", "yes")


def curve_keys(cfg: dict) -> Optional[CurveKeys]:
    """The server's CURVE keys from ``--curve_secret`` and ``--curve_authorized``; None
    without ``--curve_secret`` (the server then runs without keys).

    Raises:
      ValueError: ``--curve_authorized`` without ``--curve_secret``, or a key file
        CurveKeys refuses. OSError: a key file that cannot be read.
    """
    if not cfg["curve_secret"]:
        if cfg["curve_authorized"]:
            raise ValueError("--curve_authorized needs --curve_secret")
        return None
    return CurveKeys(cfg["curve_secret"], authorized_dir=cfg["curve_authorized"])


def checkpoint_settings(cfg: dict) -> dict:
    """The server's checkpoint arguments from ``--checkpoint_dir`` / ``--checkpoint_every``."""
    out = {}
    if cfg["checkpoint_dir"] is not None:
        out["checkpoint_dir"] = str(cfg["checkpoint_dir"])
    if cfg["checkpoint_every"] is not None:
        out["checkpoint_every"] = float(cfg["checkpoint_every"])
    return out
