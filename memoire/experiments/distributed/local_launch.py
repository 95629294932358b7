"""A local distributed run: ``config.num_actors`` actor processes spawned on this machine (or
none, for actors started by endpoint with ``memoire actor``) and the learner in this process."""

from __future__ import annotations

import time

from memoire.experiments.distributed.actor import actor_main
from memoire.experiments.distributed.config import DistributedConfig
from memoire.experiments.distributed.learner import run_learner
from memoire.experiments.distributed.sockets import ActorEndpoints, LearnerSockets


def _actor_context():
    """Where a local run's actor processes come from: forks of a server process that imported
    once what every actor imports before reading gin (:mod:`memoire.experiments.actor_imports`:
    TensorFlow, JAX, Dopamine; 8-9 s of CPU per actor on a 2-core machine), so each actor starts
    in a fraction of a second. Never forks of the learner, whose TensorFlow and JAX are running
    (unsafe to fork); a fresh interpreter each (spawn) where there is no forkserver."""
    import multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # Taken when the server starts (at the first actor of this process's first run).
    ctx.set_forkserver_preload(["memoire.experiments.actor_imports"])
    return ctx


def run(run_spec: dict, config: DistributedConfig) -> int:
    """Starts ``config.num_actors`` actor processes and runs the learner here.

    Args:
      run_spec: the run's ``dir``, ``gin_files``, ``bindings`` and ``seed``.
      config: the launch's settings.

    Actors are stopped (stop notice and event, then join with a timeout, then terminate)
    however the learner ends. Returns 0 on success.
    """
    ctx = _actor_context()
    sockets = LearnerSockets(config)
    stop = ctx.Event()
    endpoints = ActorEndpoints(
        sockets.endpoints["experience"],
        sockets.endpoints["params"],
        config.queue_chunks,
        config.episodes_ahead,
        stop,
        config.keepalive,
    )
    actor_spec = {k: run_spec[k] for k in ("gin_files", "bindings", "seed")}
    procs = [
        ctx.Process(
            target=actor_main,
            name=f"memoire-actor-{i}",
            daemon=True,
            args=(i, actor_spec, config.as_dict(), endpoints),
        )
        for i in range(config.num_actors if config.spawn_actors else 0)
    ]
    try:
        for p in procs:
            p.start()
        alive = (
            (lambda: any(p.is_alive() for p in procs))
            if procs
            else (lambda: not sockets.actors_gone())
        )
        actors_label = f"{config.num_actors} actor(s)" if procs else "actors started by endpoint"
        run_learner(run_spec, config, sockets, actors_label, alive)
    finally:
        stop.set()
        sockets.stop_actors()
        deadline = time.time() + 10.0
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.time()))
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        sockets.close()
    return 0
