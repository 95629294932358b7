"""``memoire serve``: the one serve command. It serves either

- a ReplayMemoryServer (the default)::

      memoire serve [--gin_file F ...] [--gin_binding B ...] [flags]

  It prints the endpoints (``memoire serve: pub EP  rep EP  pull EP``, stdout), then logs a
  line of live counters per interval (inserts/s: steps ingested plus cache
  rows received; samples/s: rows sampled; stored: entries and episodes in the server's
  memory, which actors stream in (central mode); caches held; episodes reported: what
  actors with memories of their own counted, ``update_counter``; rejected). With
  ``--tensorboard DIR`` the counters also go to TensorBoard event files in DIR, written
  without TensorFlow (:mod:`memoire.tensorboard`; tags ``replay/...`` and ``server/...``).
  Ctrl-C (or SIGTERM) stops it and flushes the logfile.

- or one Dopamine-compatible buffer, for the proxies of :mod:`memoire.dopamine_compat.remote`
  (a remote-call server with no replay memory)::

      memoire serve --buffer circular|prioritized|jax|jax_prioritized [--name N]
                    [--gin_file F ...] [--arg KEY=VALUE ...] [--rep EP] [flags]

  The buffer's arguments come from the gin files (the agent's own: its
  ``MemoireOutOfGraph[Prioritized]ReplayBuffer`` / ``ReplayBuffer`` bindings; bindings of
  classes the server never builds are skipped) and from ``--arg`` (Python literals), the
  latter winning. It prints ``ENDPOINT <rep>`` (one line, flushed) once it answers.
  ``python -m memoire.dopamine_compat.remote --serve KIND ...`` is the same command.

Each flag is also a gin parameter of ``serve_config``, e.g.
``--gin_binding "serve_config.max_step = 1000"``; flags win over gin. The options below
describe them.
"""

from __future__ import annotations

import ast
import errno
import logging
import os
import signal
import sys
import threading
import time
from typing import Optional, Sequence

import numpy as np
import zmq

from memoire import cli
from memoire.server.central_service import DEFAULT_MAX_COUNTER_CLIENTS
from memoire.server.rpc_host import DEFAULT_MAX_BATCH, DEFAULT_REPLY_CACHE_BYTES
from memoire.server.sampling_service import default_stream_threads
from memoire.server.workers import DEFAULT_MAX_MESSAGE_BYTES, BindError
from memoire.transport import KEEPALIVE_S, PEER_TIMEOUT_S, RECEIVE_HWM

log = logging.getLogger(__name__)

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
BUFFER_KINDS = ("circular", "prioritized", "jax", "jax_prioritized")
LIMITS = (
    "max_stream_bytes",
    "max_open_bytes",
    "reply_cache_bytes",
    "max_batch",
    "max_counter_clients",
    "allow_nonfinite",
)


# --NAME help texts (each NAME is also the gin parameter serve_config.NAME): one short line
# each; what a setting means at length is in the README and docs/LIMITS.md. Defaults that are
# the server's own are read from the constants the server uses, never written here again.
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
    buffer=f"the buffer's kind: {', '.join(BUFFER_KINDS)}",
    name="the name clients ask for (an agent's replay_name)",
    arg="a buffer argument as a Python literal (repeatable)",
    checkpoint_root="folder remote save/load stay in ('none': refused)",
    seed="seed of the sampling",
    tensorboard="also write the counters as TensorBoard scalars here",
    checkpoint_dir="the newest is loaded at start; one is written on request, "
    "every --checkpoint_every s and at the stop; 3 are kept",
    checkpoint_every="seconds between periodic checkpoints",
)
_TYPES = {
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
_ALIASES = {"rep": "--endpoint"}
# The sampling stream's endpoint (memoire.stream.SamplingStream), off unless given.
DEFAULTS["stream"] = None
HELP["stream"] = "endpoint of sampling streams (docs/STREAM.md; default: none)"
DEFAULTS["stream_threads"] = None
HELP["stream_threads"] = f"sampler threads per stream (default here: {default_stream_threads()})"
_TYPES["stream_threads"] = int

# The rate limiter (memoire.rate_limiter, Reverb's semantics), off unless a flag sets it.
DEFAULTS.update(samples_per_insert=None, min_size_to_sample=None, rate_error_buffer=None)
HELP.update(
    samples_per_insert="transitions sampled per one stored (with --rate_error_buffer)",
    min_size_to_sample=f"stored before the first sample (default {MIN_SIZE_TO_SAMPLE})",
    rate_error_buffer="half width of the band around the ratio, in samples",
)
_TYPES.update(samples_per_insert=float, min_size_to_sample=int, rate_error_buffer=float)

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
_TYPES.update(peer_timeout=float, max_message_bytes=int)
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
_BOOLEAN_FLAGS = ("allow_nonfinite", "compress_states")  # --NAME alone means 1


def _shape(text: str):
    text = str(text).strip()
    return tuple(int(x) for x in text.split(",") if x.strip()) if text else ()


def serve_config(**overrides) -> dict:
    """The settings of ``memoire serve`` (gin-configurable as ``serve_config.NAME``)."""
    cfg = dict(DEFAULTS)
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"serve: unknown settings {sorted(unknown)}")
    cfg.update(overrides)
    return cfg


def build_server(cfg: dict):
    """A ReplayMemoryServer for the settings `cfg` (see :func:`serve_config`)."""
    from memoire.server import ReplayMemoryServer
    from memoire.transport import CurveKeys

    r = _shape(cfg["reward_shape"])
    templates = (
        np.zeros(_shape(cfg["state_shape"]), cfg["state_dtype"]),
        np.zeros(_shape(cfg["action_shape"]), cfg["action_dtype"]),
        np.zeros(r, np.float32),
        np.zeros((), np.float32),
        np.zeros(r, np.float32),
        np.zeros(r, np.float32),
        np.zeros(_shape(cfg["info_shape"]), cfg["info_dtype"]),
    )
    keys = (
        CurveKeys(cfg["curve_secret"], authorized_dir=cfg["curve_authorized"])
        if cfg["curve_secret"]
        else None
    )
    limits = {k: int(cfg[k]) for k in LIMITS[:-1] if cfg[k] is not None}  # flags come as str
    if cfg["allow_nonfinite"] is not None:
        limits["allow_nonfinite"] = _flag(cfg["allow_nonfinite"])
    if cfg["seed"] is not None:
        limits["seed"] = int(cfg["seed"])
    if cfg["peer_timeout"] is not None:
        limits["peer_timeout"] = float(cfg["peer_timeout"])
    if cfg["max_message_bytes"] is not None:
        limits["max_message_bytes"] = int(cfg["max_message_bytes"])
    if cfg["compress_states"] is not None:
        limits["compress_states"] = _flag(cfg["compress_states"], "compress_states")
    limits.update(_checkpoint_settings(cfg))
    limiter = _rate_limiter(cfg)
    if limiter is not None:
        limits["rate_limiter"] = limiter
    srv = ReplayMemoryServer(
        *templates,
        int(cfg["max_step"]),
        cfg["pub"],
        int(cfg["n_caches"]),
        bind_host=cfg["bind_host"],
        keys=keys,
        **limits,
    )
    for name in ("cache_size", "frame_stack", "multi_step", "priority_exponent", "discount_factor"):
        if cfg[name] is not None:
            setattr(srv.rem, name, cfg[name])
    if cfg["logfile"]:
        srv.set_logfile(cfg["logfile"], cfg["logmode"])
    return srv


def _rate_limiter(cfg: dict):
    """The server's rate limiter from the three rate flags; None when none is given.

    Raises:
      ValueError: a ratio without its error buffer (Reverb asks for both), or the reverse.
    """
    from memoire.rate_limiter import MinSize, SampleToInsertRatio

    spi, size, error = (
        cfg[k] for k in ("samples_per_insert", "min_size_to_sample", "rate_error_buffer")
    )
    if spi is None:
        if error is not None:
            raise ValueError("--rate_error_buffer: needs --samples_per_insert")
        return None if size is None else MinSize(int(size))
    if error is None:
        raise ValueError(
            "--samples_per_insert: needs --rate_error_buffer (the band's half width in samples)"
        )
    return SampleToInsertRatio(
        float(spi), MIN_SIZE_TO_SAMPLE if size is None else int(size), float(error)
    )


def _checkpoint_settings(cfg: dict) -> dict:
    """The server's checkpoint arguments from ``--checkpoint_dir`` / ``--checkpoint_every``."""
    out = {}
    if cfg["checkpoint_dir"] is not None:
        out["checkpoint_dir"] = str(cfg["checkpoint_dir"])
    if cfg["checkpoint_every"] is not None:
        out["checkpoint_every"] = float(cfg["checkpoint_every"])
    return out


def _last_checkpoint(save) -> int:
    """A last checkpoint when the server stops (SIGTERM, Ctrl-C, --duration), after its
    workers stopped: it holds everything stored. `save`: writes one and returns its path (None:
    the server has no checkpoint folder). Returns the exit status: 1 when it failed (logged;
    what was stored since the previous checkpoint is lost)."""
    if save is None:
        return 0
    try:
        log.info("checkpoint %s", save())
    except OSError as e:
        log.error("last checkpoint failed: %s", e)
        return 1
    return 0


def _flag(value, name: str = "allow_nonfinite") -> Optional[bool]:
    """The 0/1 setting `name` as given by a flag (str) or gin (bool, int); None when not
    given."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("0", "1", "true", "false", "yes", "no"):
        raise ValueError(f"{name}: expected 0 or 1, got {value!r}")
    return text in ("1", "true", "yes")


def _buffer_arguments(items) -> dict:
    """``--arg KEY=VALUE`` items as keyword arguments (values as Python literals; a bare word
    is a string)."""
    kwargs = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise cli.UsageError(f"--arg: expected KEY=VALUE, got {item!r}")
        try:
            kwargs[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            kwargs[key.strip()] = value.strip()
    return kwargs


def build_buffer_server(cfg: dict):
    """``(server, rep endpoint)``: the Dopamine-compatible buffer ``cfg["buffer"]`` served by a
    running :class:`memoire.server.RpcServer` (see
    :func:`memoire.dopamine_compat.buffer_server.start_buffer_server`).

    Raises:
      cli.UsageError: a bad ``--arg``, buffer argument, key file or endpoint.
    """
    from memoire.dopamine_compat import buffer_server
    from memoire.transport import CurveKeys

    kwargs = _buffer_arguments(cfg["arg"])
    if _flag(cfg["compress_states"], "compress_states"):
        raise cli.UsageError(
            "--compress_states: compresses the replay memory server's states; a --buffer "
            "server stores Dopamine's layout uncompressed"
        )
    if cfg["curve_authorized"] and not cfg["curve_secret"]:
        raise cli.UsageError("--curve_authorized needs --curve_secret")
    try:
        keys = (
            CurveKeys(cfg["curve_secret"], authorized_dir=cfg["curve_authorized"])
            if cfg["curve_secret"]
            else None
        )
        limits = {k: int(cfg[k]) for k in ("max_batch", "reply_cache_bytes") if cfg[k] is not None}
        limits["bind_host"] = cfg["bind_host"]
        root = cfg["checkpoint_root"]
        root = None if root is None or str(root).lower() == "none" else os.path.abspath(root)
        return buffer_server.start_buffer_server(
            cfg["buffer"],
            cfg["name"],
            rep_endpoint=cfg["rep"],
            seed=cfg["seed"],
            checkpoint_root=root,
            keys=keys,
            server_kwargs=limits,
            allow_nonfinite=bool(_flag(cfg["allow_nonfinite"])),
            **_checkpoint_settings(cfg),
            **kwargs,
        )
    except BindError as e:
        raise cli.UsageError(bind_error(e)) from None
    except (
        OSError,
        ValueError,
        TypeError,
        AttributeError,
        SyntaxError,
        ImportError,
        zmq.ZMQError,
        TimeoutError,
    ) as e:
        raise cli.UsageError(e) from None


# What --help shows: a few lines; the module docstring and the README say the rest.
USAGE = "memoire serve [options]\n       memoire serve --buffer KIND [options]"
DESCRIPTION = """\
Runs a replay memory server, or with --buffer one Dopamine-compatible buffer for remote agents.
It prints its endpoints on stdout ("memoire serve: pub EP  rep EP  pull EP", or "ENDPOINT EP"
with --buffer), then a line of live counters every --interval seconds on stderr, until Ctrl-C or
SIGTERM. Each option is also the gin parameter serve_config.NAME (--gin_binding
"serve_config.max_step = 1000"); options win over gin. More: README.md ("Distributed"),
docs/LIMITS.md, docs/STREAM.md."""
_METAVARS = dict(
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


def build_parser() -> cli.ArgumentParser:
    """The parser of ``memoire serve``: ``--gin_file``, ``--gin_binding`` and one option per
    setting of :data:`DEFAULTS` (default None: the gin binding, else :data:`DEFAULTS`), in the
    groups of :data:`GROUPS`."""
    p = cli.ArgumentParser(
        prog="memoire serve",
        usage=USAGE,
        description=DESCRIPTION,
        formatter_class=lambda prog: cli.HelpFormatter(prog, max_help_position=26),
    )
    p.add_argument(
        "--gin_file",
        "--gin_files",
        action="append",
        default=[],
        metavar="FILE",
        help="gin file binding serve_config.NAME, or the buffer's classes (repeatable)",
    )
    p.add_argument(
        "--gin_binding",
        "--gin_bindings",
        action="append",
        default=[],
        metavar="B",
        help='gin binding such as "serve_config.max_step = 1000" (repeatable)',
    )
    grouped = {name: title for title, names in GROUPS.items() for name in names.split()}
    groups = {title: p.add_argument_group(title) for title in GROUPS}
    for name, default in DEFAULTS.items():
        g = groups[grouped[name]]
        shown = "" if default is None or "(default" in HELP[name] else f" (default: {default!r})"
        flags = [f"--{name}"] + ([_ALIASES[name]] if name in _ALIASES else [])
        if name == "arg":
            g.add_argument(
                *flags, action="append", default=None, metavar="KEY=VALUE", help=HELP[name]
            )
        elif name in _BOOLEAN_FLAGS:
            g.add_argument(
                *flags, nargs="?", const="1", default=None, metavar="0|1", help=HELP[name]
            )
        else:
            kind = _TYPES.get(name, str)
            g.add_argument(
                *flags,
                type=kind,
                default=None,
                choices=BUFFER_KINDS if name == "buffer" else None,
                metavar=_METAVARS.get(name, "N" if kind is int else "X"),
                help=HELP[name] + shown,
            )
    return p


def _config(args) -> dict:
    """The settings from gin and flags, checked by building nothing yet.

    Raises:
      cli.UsageError: a missing gin file, a bad binding or setting.
    """
    overrides = {k: v for k, v in vars(args).items() if k in DEFAULTS and v is not None}
    try:
        if args.gin_file or args.gin_binding:
            import gin

            cli.check_files(args.gin_file, "--gin_file")
            configurable = gin.external_configurable(serve_config, module="memoire")
            # A buffer's gin files are an agent's: they bind classes the server never builds.
            gin.parse_config_files_and_bindings(
                args.gin_file, args.gin_binding, skip_unknown=args.buffer is not None
            )
            cfg = configurable(**overrides)
        else:
            cfg = serve_config(**overrides)
        for name in ("state_shape", "action_shape", "reward_shape", "info_shape"):
            _shape(cfg[name])
        for name in ("state_dtype", "action_dtype", "info_dtype"):
            np.dtype(cfg[name])
        for name in _BOOLEAN_FLAGS:
            _flag(cfg[name], name)
    except (OSError, ValueError, TypeError, SyntaxError, ImportError) as e:
        raise cli.UsageError(e) from None
    return cfg


def counter_scalars(now: dict, before: dict, seconds: float, cache_size: int, memory=None) -> dict:
    """The figures of one interval, as TensorBoard scalars (tag -> number).

    Args:
      now, before: :meth:`ReplayMemoryServer.stats` at the end and start of the interval.
      seconds: the interval's length.
      cache_size: rows per cache (a cache received counts as that many inserts).
      memory: the server's ReplayMemory, for its priority weights (None: left out).

    ``replay/``: ``size`` (entries in the memory), ``episodes`` (episodes in the memory),
    ``inserts`` and ``samples`` (cumulative rows),
    ``inserts_per_s``, ``samples_per_s``, ``batches_per_s``, ``priority_total`` (the sum of
    the sampling weights) and ``priority_mean`` (per sampleable entry; the memory keeps the sum,
    not each weight, so no wider spread is read without a scan). ``server/``: ``caches_held``,
    ``episodes`` (reported by clients' ``update_counter``), ``open_streams``, ``open_stream_bytes``, ``rejected`` and
    ``rejected/<reason>``.
    """
    dt = max(seconds, 1e-9)

    def inserted(s):
        return s.get("steps_in", 0) + cache_size * s.get("caches", 0)

    out = {
        "replay/size": now.get("memory_size", 0),
        "replay/inserts": inserted(now),
        "replay/samples": now.get("rows_sampled", 0),
        "replay/inserts_per_s": (inserted(now) - inserted(before)) / dt,
        "replay/samples_per_s": (now.get("rows_sampled", 0) - before.get("rows_sampled", 0)) / dt,
        "replay/batches_per_s": (now.get("batches", 0) - before.get("batches", 0)) / dt,
        "replay/episodes": now.get("memory_episodes", 0),
        "server/caches_held": now.get("caches_held", 0),
        "server/episodes": now.get("total_episodes", 0),
        "server/open_streams": now.get("open_streams", 0),
        "server/open_stream_bytes": now.get("open_stream_bytes", 0),
        "server/rejected": now.get("rejected_total", 0),
    }
    for reason, n in sorted(now.get("rejected", {}).items()):
        out[f"server/rejected/{reason}"] = n
    if memory is not None:
        total, sampleable = float(memory.total_weight), int(memory.num_sampleable)
        out["replay/priority_total"] = total
        out["replay/priority_mean"] = total / sampleable if sampleable else 0.0
    return out


def live_line(stats: dict, figures: dict) -> str:
    """The live counter line ``memoire serve`` logs each interval, from
    :meth:`ReplayMemoryServer.stats` and :func:`counter_scalars`'s ``figures``: rates, what the
    server's memory stores (entries and episodes: what actors streamed in, central mode),
    caches held, episodes reported by ``update_counter`` (actors keeping memories of their
    own) and messages rejected."""
    return (
        f"inserts/s {figures['replay/inserts_per_s']:10.1f}  "
        f"samples/s {figures['replay/samples_per_s']:10.1f}  "
        f"stored {stats.get('memory_size', 0)} entries in "
        f"{stats.get('memory_episodes', 0)} episodes  "
        f"caches {stats.get('caches_held', 0)}  "
        f"episodes reported {stats.get('total_episodes', 0)}  "
        f"rejected {stats.get('rejected_total', 0)}"
    )


def _check_tensorboard(cfg: dict) -> None:
    """Checks ``--tensorboard`` before anything starts, writing nothing.

    Raises:
      cli.UsageError: the directory cannot be made or written, or ``--buffer`` is given.
    """
    if cfg["tensorboard"] is None:
        return
    if cfg["buffer"] is not None:
        raise cli.UsageError(
            "--tensorboard: writes the replay memory server's counters; a --buffer server has none"
        )
    cli.check_output_dir(cfg["tensorboard"], "--tensorboard")


def _tensorboard_writer(cfg: dict):
    """The event-file writer of ``--tensorboard`` (None without it)."""
    if cfg["tensorboard"] is None:
        return None
    from memoire.tensorboard import SummaryWriter

    try:
        return SummaryWriter(cfg["tensorboard"])
    except (OSError, ValueError) as e:
        raise cli.UsageError(f"--tensorboard: {e}") from None


def keys_warning(cfg: dict) -> Optional[str]:
    """The warning of a server that binds beyond loopback (an endpoint's host, or
    ``--bind_host`` for a ``*`` host; see :func:`memoire.transport.beyond_loopback`) without
    ``--curve_secret``; None when it has keys or stays on this machine."""
    from memoire import transport

    if cfg["curve_secret"]:
        return None
    names = ("rep",) if cfg["buffer"] is not None else ("pub", "rep", "pull", "stream")
    bound = []
    for name in names:
        if cfg[name] is None:
            continue
        try:
            bound.append(transport.bind_address(str(cfg[name]), str(cfg["bind_host"])))
        except ValueError:
            continue  # a malformed endpoint: refused when bound, with its own message
    return transport.clear_text_warning(
        "memoire serve",
        bound,
        "add keys with --curve_secret FILE (and --curve_authorized DIR)",
    )


@cli.entry_point("memoire serve")
def main(argv: Optional[Sequence[str]] = None) -> int:
    cfg = _config(build_parser().parse_args(argv))
    _check_tensorboard(cfg)
    warning = keys_warning(cfg)
    if warning:
        log.warning("%s", warning)
    if cfg["buffer"] is not None:
        return _serve_buffer(cfg)
    try:
        srv = build_server(cfg)
    except BindError as e:  # --pub
        raise cli.UsageError(bind_error(e)) from None
    except (ValueError, TypeError, OSError) as e:  # settings the memory or the keys refuse
        raise cli.UsageError(e) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    writer = None
    serving = False
    try:
        try:
            ep = srv.start(cfg["rep"], cfg["pull"])
        except BindError as e:  # an endpoint in use, or not this machine's
            raise cli.UsageError(bind_error(e)) from None
        except (zmq.ZMQError, TimeoutError) as e:
            raise cli.UsageError(
                f"cannot start --rep {cfg['rep']} / --pull {cfg['pull']}: {e}"
            ) from None
        stream = _start_stream(srv, cfg)
        writer = _tensorboard_writer(cfg)
        cli.emit(f"memoire serve: pub {ep['pub']}  rep {ep['rep']}  pull {ep['pull']}")
        if stream is not None:
            cli.emit(f"memoire serve: stream {stream}")
        serving = True
        t_end = None if cfg["duration"] is None else time.monotonic() + float(cfg["duration"])
        last, t_last = srv.stats(), time.monotonic()
        cs = int(srv.rem.cache_size)
        tick = 0
        while not stop.is_set() and (t_end is None or time.monotonic() < t_end):
            stop.wait(
                float(cfg["interval"])
                if t_end is None
                else min(float(cfg["interval"]), max(0.0, t_end - time.monotonic()))
            )
            now, s = time.monotonic(), srv.stats()
            figures = counter_scalars(s, last, now - t_last, cs, srv.rem)
            log.info("%s", live_line(s, figures))
            tick += 1
            if writer is not None:
                writer.scalars(tick, figures)  # step: the counter line's number
            last, t_last = s, now
    finally:
        srv.close()  # flushes and closes the logfile
        if writer is not None:
            writer.close()
        if serving:
            log.info("stopped")
    return _last_checkpoint(None if srv.checkpoint_dir is None else srv.checkpoint)


def bind_error(e: BindError, flag: Optional[str] = None) -> str:
    """The one line of a socket that could not bind: which option's endpoint, why, and what to
    do (``flag``: the option, when the socket's label is not its name)."""
    flag = flag or {"pub": "pub", "rep": "rep", "pull": "pull"}.get(e.label, e.label)
    hint = ""
    if e.errno == errno.EADDRINUSE:
        hint = (
            "; another process listens there: stop it, or give another port "
            f"(--{flag} tcp://HOST:* lets the OS choose)"
        )
    elif e.errno == errno.EADDRNOTAVAIL:
        hint = "; not an address of this machine (--bind_host names one of its interfaces)"
    return f"--{flag} {e.endpoint}: {e.reason}{hint}"


def _start_stream(srv, cfg: dict) -> Optional[str]:
    """Starts the sampling stream worker when ``--stream`` names an endpoint; returns the
    endpoint bound (None without ``--stream``)."""
    if cfg["stream"] is None:
        return None
    try:
        ep = srv.start_stream(cfg["stream"], threads=cfg["stream_threads"])
    except ValueError as e:
        raise cli.UsageError(f"--stream_threads: {e}") from None
    except BindError as e:
        raise cli.UsageError(bind_error(e, "stream")) from None
    except (zmq.ZMQError, TimeoutError) as e:
        raise cli.UsageError(f"cannot bind --stream {cfg['stream']}: {e}") from None
    return ep


def _serve_buffer(cfg: dict) -> int:
    """Serves one buffer until SIGINT/SIGTERM (or ``duration``): prints ``ENDPOINT <rep>``.
    With ``--checkpoint_dir``, writes a last checkpoint once the workers stopped."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server, endpoint = build_buffer_server(cfg)
    try:
        cli.emit(f"ENDPOINT {endpoint}")
        stop.wait(None if cfg["duration"] is None else float(cfg["duration"]))
    finally:
        server.close()
    return _last_checkpoint(None if server.checkpoints is None else server.checkpoints.save)


if __name__ == "__main__":
    sys.exit(main())
