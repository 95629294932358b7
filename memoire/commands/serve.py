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

import errno
import logging
import signal
import sys
import threading
import time
from typing import Optional, Sequence

import numpy as np
import zmq

from memoire import cli
from memoire.dopamine_compat.buffer_server import BUFFER_KINDS
from memoire.dopamine_compat.buffer_server_from_settings import build_buffer_server
from memoire.server.counters import ServerCounters, counter_scalars, live_line
from memoire.server.from_settings import build_server
from memoire.server.serve_settings import (
    BOOLEAN_FLAGS,
    DEFAULTS,
    HELP,
    SETTINGS,
    read_flag,
    read_shape,
    serve_config,
)
from memoire.server.workers import BindError

# The settings' registry, the builders and the counters live in the library (above); these
# names stay importable from here, where they were first.
__all__ = [
    "BUFFER_KINDS",
    "DEFAULTS",
    "HELP",
    "bind_error",
    "build_buffer_server",
    "build_parser",
    "build_server",
    "counter_scalars",
    "keys_warning",
    "live_line",
    "main",
    "serve_config",
]

log = logging.getLogger(__name__)


# What --help shows: a few lines; the module docstring and the README say the rest.
USAGE = "memoire serve [options]\n       memoire serve --buffer KIND [options]"
DESCRIPTION = """\
Runs a replay memory server, or with --buffer one Dopamine-compatible buffer for remote agents.
It prints its endpoints on stdout ("memoire serve: pub EP  rep EP  pull EP", or "ENDPOINT EP"
with --buffer), then a line of live counters every --interval seconds on stderr, until Ctrl-C or
SIGTERM. Each option is also the gin parameter serve_config.NAME (--gin_binding
"serve_config.max_step = 1000"); options win over gin. More: README.md ("Distributed"),
docs/LIMITS.md, docs/STREAM.md."""


def build_parser() -> cli.ArgumentParser:
    """The parser of ``memoire serve``: ``--gin_file``, ``--gin_binding`` and one option per
    setting of :data:`~memoire.server.serve_settings.SETTINGS`, in its groups (default None:
    the gin binding, else the setting's default)."""
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
    # The kinds are the buffer server's (one list, where the buffers are built).
    help_ = dict(HELP, buffer=f"{HELP['buffer']}: {', '.join(BUFFER_KINDS)}")
    for title, settings in SETTINGS.items():
        group = p.add_argument_group(title)
        for name, setting in settings.items():
            default = setting.default
            shown = (
                "" if default is None or "(default" in setting.help else f" (default: {default!r})"
            )
            flags = [f"--{name}", *setting.aliases]
            common = dict(
                default=None,  # None: given by neither flag; gin, then DEFAULTS, decide
                metavar=setting.metavar or ("N" if setting.type is int else "X"),
                help=help_[name] + shown,
            )
            if setting.form == "repeated":
                group.add_argument(*flags, action="append", **common)
            elif setting.form == "flag":
                group.add_argument(*flags, nargs="?", const="1", **common)
            else:
                choices = BUFFER_KINDS if name == "buffer" else None
                group.add_argument(*flags, type=setting.type, choices=choices, **common)
    return p


def _config(args) -> dict:
    """The settings from gin and flags, checked by building nothing yet.

    Raises:
      cli.UsageError: a missing gin file, a bad binding or setting; gin not installed (naming
        the extra to install).
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
            read_shape(cfg[name])
        for name in ("state_dtype", "action_dtype", "info_dtype"):
            np.dtype(cfg[name])
        for name in BOOLEAN_FLAGS:
            read_flag(cfg[name], name)
    except (OSError, ValueError, TypeError, SyntaxError, ImportError) as e:
        raise cli.UsageError(cli.missing_extra(e) or e) from None
    _check_tensorboard(cfg)
    return cfg


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
    counters = None
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
        try:
            counters = ServerCounters(srv, cfg["tensorboard"])
        except (OSError, ValueError) as e:
            raise cli.UsageError(f"--tensorboard: {e}") from None
        cli.emit(f"memoire serve: pub {ep['pub']}  rep {ep['rep']}  pull {ep['pull']}")
        if stream is not None:
            cli.emit(f"memoire serve: stream {stream}")
        serving = True
        t_end = None if cfg["duration"] is None else time.monotonic() + float(cfg["duration"])
        while not stop.is_set() and (t_end is None or time.monotonic() < t_end):
            stop.wait(
                float(cfg["interval"])
                if t_end is None
                else min(float(cfg["interval"]), max(0.0, t_end - time.monotonic()))
            )
            log.info("%s", counters.take())
    finally:
        srv.close()  # flushes and closes the logfile
        if counters is not None:
            counters.close()
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
    try:
        server, endpoint = build_buffer_server(cfg)
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
        raise cli.UsageError(cli.missing_extra(e) or e) from None
    try:
        cli.emit(f"ENDPOINT {endpoint}")
        stop.wait(None if cfg["duration"] is None else float(cfg["duration"]))
    finally:
        server.close()
    return _last_checkpoint(None if server.checkpoints is None else server.checkpoints.save)


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


if __name__ == "__main__":
    sys.exit(main())
