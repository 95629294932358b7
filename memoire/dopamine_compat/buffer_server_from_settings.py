"""A served Dopamine-compatible buffer built from the settings of ``memoire serve --buffer``
(:mod:`memoire.server.serve_settings`): the buffer's kind and name, its ``--arg`` arguments,
the host's keys, limits and checkpoints (:func:`memoire.dopamine_compat.buffer_server.start_buffer_server`)."""

from __future__ import annotations

import ast
import os

from memoire.dopamine_compat import buffer_server
from memoire.server.serve_settings import checkpoint_settings, curve_keys, read_flag


def buffer_arguments(items) -> dict:
    """``--arg KEY=VALUE`` items as keyword arguments (values as Python literals; a bare word
    is a string).

    Raises:
      ValueError: an item that is not KEY=VALUE.
    """
    kwargs = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--arg: expected KEY=VALUE, got {item!r}")
        try:
            kwargs[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            kwargs[key.strip()] = value.strip()
    return kwargs


def build_buffer_server(cfg: dict):
    """``(server, rep endpoint)``: the Dopamine-compatible buffer ``cfg["buffer"]`` (one of
    :data:`~memoire.dopamine_compat.buffer_server.BUFFER_KINDS`) served by a running
    :class:`memoire.server.RpcServer`.

    Raises:
      ValueError: a bad ``--arg``, a setting a buffer server does not take
        (``--compress_states``), keys without a secret, or a buffer argument refused.
      TypeError, AttributeError: buffer arguments the class does not take or lacks.
      OSError: a key file or checkpoint folder that cannot be read.
      memoire.server.workers.BindError: ``--rep`` cannot be bound. zmq.ZMQError,
      TimeoutError: the host did not start. ImportError: the buffer's packages are missing.
    """
    kwargs = buffer_arguments(cfg["arg"])
    if read_flag(cfg["compress_states"], "compress_states"):
        raise ValueError(
            "--compress_states: compresses the replay memory server's states; a --buffer "
            "server stores Dopamine's layout uncompressed"
        )
    keys = curve_keys(cfg)
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
        allow_nonfinite=bool(read_flag(cfg["allow_nonfinite"])),
        **checkpoint_settings(cfg),
        **kwargs,
    )
