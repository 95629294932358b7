"""A :class:`~memoire.server.ReplayMemoryServer` built from the settings of ``memoire serve``
(:mod:`memoire.server.serve_settings`): the memory's templates from the shapes and dtypes,
the keys, limits, rate limiter and checkpoints from their settings."""

from __future__ import annotations

import numpy as np

from memoire.rate_limiter import MinSize, SampleToInsertRatio
from memoire.server.replay_memory_server import ReplayMemoryServer
from memoire.server.serve_settings import (
    LIMITS,
    MIN_SIZE_TO_SAMPLE,
    checkpoint_settings,
    curve_keys,
    read_flag,
    read_shape,
)


def build_server(cfg: dict) -> ReplayMemoryServer:
    """A ReplayMemoryServer for the settings ``cfg`` (see
    :func:`~memoire.server.serve_settings.serve_config`), its PUB socket bound, not started.

    Raises:
      ValueError, TypeError: a setting the memory refuses. OSError: a key file that cannot be
        read. memoire.server.workers.BindError: ``--pub`` cannot be bound.
    """
    r = read_shape(cfg["reward_shape"])
    templates = (
        np.zeros(read_shape(cfg["state_shape"]), cfg["state_dtype"]),
        np.zeros(read_shape(cfg["action_shape"]), cfg["action_dtype"]),
        np.zeros(r, np.float32),
        np.zeros((), np.float32),
        np.zeros(r, np.float32),
        np.zeros(r, np.float32),
        np.zeros(read_shape(cfg["info_shape"]), cfg["info_dtype"]),
    )
    keys = curve_keys(cfg)
    limits = {k: int(cfg[k]) for k in LIMITS[:-1] if cfg[k] is not None}  # flags come as str
    if cfg["allow_nonfinite"] is not None:
        limits["allow_nonfinite"] = read_flag(cfg["allow_nonfinite"])
    if cfg["seed"] is not None:
        limits["seed"] = int(cfg["seed"])
    if cfg["peer_timeout"] is not None:
        limits["peer_timeout"] = float(cfg["peer_timeout"])
    if cfg["max_message_bytes"] is not None:
        limits["max_message_bytes"] = int(cfg["max_message_bytes"])
    if cfg["compress_states"] is not None:
        limits["compress_states"] = read_flag(cfg["compress_states"], "compress_states")
    limits.update(checkpoint_settings(cfg))
    limiter = rate_limiter(cfg)
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


def rate_limiter(cfg: dict):
    """The server's rate limiter from the three rate settings; None when none is given.

    Raises:
      ValueError: a ratio without its error buffer (Reverb asks for both), or the reverse.
    """
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
