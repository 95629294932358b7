"""The settings of ``memoire serve``: one registry that names each setting, its default, type,
help line, group in ``--help`` and metavar, and the readers that turn a setting (a flag's
string, or a gin value) into what a server takes.

Each setting NAME is the flag ``--NAME`` and the gin parameter ``serve_config.NAME``; a
settings dict (``cfg``, see :func:`serve_config`) holds every name. Builders of servers read
it: :func:`memoire.server.from_settings.build_server` (a ReplayMemoryServer) and
:func:`memoire.dopamine_compat.buffer_server_from_settings.build_buffer_server` (a Dopamine
buffer). Defaults that are the server's own are read from the constants the server uses,
never written here again.
"""

from __future__ import annotations

from typing import Optional

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


DEFAULTS = dict(
    state_shape="4",
    state_dtype="float32",
    action_shape="",
    action_dtype="int64",
    reward_shape="",
    info_shape="0",
    info_dtype="uint8",
    max_step=1_000_000,
    n_caches=64,
    pub="tcp://*:*",
    rep="tcp://*:*",
    pull="tcp://*:*",
    bind_host="127.0.0.1",
    cache_size=None,
    frame_stack=None,
    multi_step=None,
    priority_exponent=None,
    discount_factor=None,
    logfile=None,
    logmode="a",
    curve_secret=None,
    curve_authorized=None,
    interval=2.0,
    duration=None,
    max_stream_bytes=None,
    max_open_bytes=None,
    reply_cache_bytes=None,
    max_batch=None,
    max_counter_clients=None,
    allow_nonfinite=None,
    buffer=None,
    name="replay",
    arg=None,
    checkpoint_root=".",
    seed=None,
    tensorboard=None,
)
DEFAULTS.update(checkpoint_dir=None, checkpoint_every=None)  # the memory server's checkpoints
LIMITS = (
    "max_stream_bytes",
    "max_open_bytes",
    "reply_cache_bytes",
    "max_batch",
    "max_counter_clients",
    "allow_nonfinite",
)


# --NAME help texts (each NAME is also the gin parameter serve_config.NAME): one short line
# each; what a setting means at length is in the README and docs/LIMITS.md.
HELP = dict(
    state_shape="state shape: comma-separated ints ('84,84'; '': scalar)",
    state_dtype="state dtype (numpy's name)",
    action_shape="action shape",
    action_dtype="action dtype",
    reward_shape="shape of reward, value and qvest (float32)",
    info_shape="info shape ('0': no info)",
    info_dtype="info dtype",
    max_step="entries the memory holds",
    n_caches="caches kept for get_batch (cache mode)",
    pub="PUB endpoint of the settings (port *: the OS's choice)",
    rep="REP endpoint of requests",
    pull="PULL endpoint of caches and episode chunks",
    bind_host="interface that '*' hosts bind to",
    cache_size="transitions per cache",
    frame_stack="frames stacked per state",
    multi_step="steps between prev and next",
    priority_exponent="priority exponent",
    discount_factor="discount factor",
    logfile="append actors' log lines to this file",
    logmode="'a' appends to --logfile, 'w' truncates it",
    curve_secret="the server's CURVE secret key file",
    curve_authorized="folder of the clients' CURVE public keys",
    interval="seconds between counter lines",
    duration="stop after this many seconds (default: never)",
    max_stream_bytes="bytes of one actor's unfinished episodes",
    max_open_bytes="bytes of all unfinished episodes",
    reply_cache_bytes="bytes of replies kept for retried calls "
    f"(default {_bytes(DEFAULT_REPLY_CACHE_BYTES)})",
    max_batch=f"rows of one remote sample call (default {DEFAULT_MAX_BATCH})",
    max_counter_clients=f"clients whose counters are kept (default {DEFAULT_MAX_COUNTER_CLIENTS})",
    allow_nonfinite="1 (or bare): store NaN/inf r, p, v from peers (default 0)",
    buffer="the buffer's kind",  # memoire serve adds the kinds (buffer_server.BUFFER_KINDS)
    name="the name clients ask for (an agent's replay_name)",
    arg="a buffer argument as a Python literal (repeatable)",
    checkpoint_root="folder remote save/load stay in ('none': refused)",
    seed="seed of the sampling",
    tensorboard="also write the counters as TensorBoard scalars here",
    checkpoint_dir="the newest is loaded at start; one is written on request, "
    "every --checkpoint_every s and at the stop; 3 are kept",
    checkpoint_every="seconds between periodic checkpoints",
)
TYPES = {
    "max_step": int,
    "n_caches": int,
    "cache_size": int,
    "frame_stack": int,
    "multi_step": int,
    "priority_exponent": float,
    "discount_factor": float,
    "interval": float,
    "duration": float,
    "max_stream_bytes": int,
    "max_open_bytes": int,
    "reply_cache_bytes": int,
    "max_batch": int,
    "max_counter_clients": int,
    "seed": int,
    "checkpoint_every": float,
}
ALIASES = {"rep": "--endpoint"}
# The sampling stream's endpoint (memoire.stream.SamplingStream), off unless given.
DEFAULTS["stream"] = None
HELP["stream"] = "endpoint of sampling streams (docs/STREAM.md; default: none)"
DEFAULTS["stream_threads"] = None
HELP["stream_threads"] = f"sampler threads per stream (default here: {default_stream_threads()})"
TYPES["stream_threads"] = int

# The rate limiter (memoire.rate_limiter, Reverb's semantics), off unless a flag sets it.
DEFAULTS.update(samples_per_insert=None, min_size_to_sample=None, rate_error_buffer=None)
HELP.update(
    samples_per_insert="transitions sampled per one stored (with --rate_error_buffer)",
    min_size_to_sample=f"stored before the first sample (default {MIN_SIZE_TO_SAMPLE})",
    rate_error_buffer="half width of the band around the ratio, in samples",
)
TYPES.update(samples_per_insert=float, min_size_to_sample=int, rate_error_buffer=float)

# Compressed states in the server's memory (ReplayMemory's compress_states), off unless given.
DEFAULTS["compress_states"] = None
HELP["compress_states"] = "1 (or bare): states LZ4-compressed, read bit for bit (default 0)"
# Liveness and the receive queues' bytes (docs/LIMITS.md), the server's defaults unless given.
DEFAULTS.update(peer_timeout=None, max_message_bytes=None)
HELP.update(
    peer_timeout="seconds of an actor's silence before its open episode is dropped "
    f"(default {PEER_TIMEOUT_S:g}; longer than clients' keepalive, {KEEPALIVE_S:g})",
    max_message_bytes="bytes of a peer's largest message; receive queues hold "
    f"{RECEIVE_HWM} per connection (default {_bytes(DEFAULT_MAX_MESSAGE_BYTES)})",
)
TYPES.update(peer_timeout=float, max_message_bytes=int)
# The options' groups in --help, in order (every setting of DEFAULTS is in one).
GROUPS = {
    "the memory": (
        "state_shape state_dtype action_shape action_dtype reward_shape info_shape info_dtype "
        "max_step n_caches compress_states seed"
    ),
    "endpoints and keys": "pub rep pull bind_host stream stream_threads curve_secret curve_authorized",
    "settings sent to clients (default: the memory's)": (
        "cache_size frame_stack multi_step priority_exponent discount_factor"
    ),
    "rate limiter (default: none)": "samples_per_insert min_size_to_sample rate_error_buffer",
    "limits on what peers make the server hold (docs/LIMITS.md; bytes default from --max_step)": (
        "max_stream_bytes max_open_bytes reply_cache_bytes max_batch max_counter_clients "
        "max_message_bytes peer_timeout allow_nonfinite"
    ),
    "checkpoints (--checkpoint_dir: the memory's, or the --buffer's)": (
        "checkpoint_dir checkpoint_every"
    ),
    "output": "interval duration logfile logmode tensorboard",
    "a Dopamine buffer instead (--buffer)": "buffer name arg checkpoint_root",
}
BOOLEAN_FLAGS = ("allow_nonfinite", "compress_states")  # --NAME alone means 1


def _shape(text: str):
    text = str(text).strip()
    return tuple(int(x) for x in text.split(",") if x.strip()) if text else ()


# The metavar of each setting's option in --help (others: N for an int, X for the rest).
METAVARS = dict(
    state_shape="SHAPE",
    action_shape="SHAPE",
    reward_shape="SHAPE",
    info_shape="SHAPE",
    state_dtype="DTYPE",
    action_dtype="DTYPE",
    info_dtype="DTYPE",
    pub="EP",
    rep="EP",
    pull="EP",
    stream="EP",
    bind_host="HOST",
    logfile="FILE",
    curve_secret="FILE",
    curve_authorized="DIR",
    checkpoint_dir="DIR",
    checkpoint_root="DIR",
    tensorboard="DIR",
    logmode="MODE",
    name="NAME",
    buffer="KIND",
    interval="S",
    duration="S",
    checkpoint_every="S",
    peer_timeout="S",
    samples_per_insert="X",
    rate_error_buffer="X",
    priority_exponent="X",
    discount_factor="X",
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
