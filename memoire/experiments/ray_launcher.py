"""Ray as a launcher: the learner, its actors and sweep indices as Ray actors and tasks.

Ray only places, starts, restarts and stops processes and hands over endpoints; experience and
parameters keep flowing over memoire's ZeroMQ sockets (:mod:`memoire.experiments.distributed`).

``memoire train --launcher ray`` (gin: ``DistributedConfig.launcher = 'ray'``) runs:

- the **learner** as one Ray actor on a node that has what it asks for
  (``RayConfig.learner_cpus``/``learner_gpus``/``learner_resources``, e.g. a custom resource
  ``learner`` given to one node by ``ray start --resources '{"learner": 1}'``). It binds its
  PULL and PUB sockets on TCP, on its node's IP address as Ray knows it (loopback when Ray runs
  a local cluster for this command) with OS-chosen ports, and hands the endpoints back to this
  driver. Bound beyond loopback, both sockets use CURVE keys made for the run
  (``RayConfig.curve``; ``memoire train --insecure`` turns them off): the driver makes them in
  memory and hands them to the learner and the actors as Ray arguments, never to a file;
  a peer without them is refused (counted in the learner's last log line);
- ``num_actors`` **actors** as Ray actors (``RayConfig.actor_cpus`` each), spread across the
  cluster's nodes other than the learner's while those have room (``RayConfig.actors_apart``:
  Ray's ``SPREAD`` and a label selector on the node id), named ``memoire-actor-<k>:<run dir>``
  in the ``memoire`` namespace. Experience and parameters travel between nodes over memoire's
  sockets, not through Ray. Each one's loop runs from its constructor, so when its process dies
  Ray restarts it (up to ``RayConfig.actor_restarts`` times) and it rejoins the learner as a new
  stream (a fresh uuid with the same actor number; the dead process's unfinished episode is
  never stored, and the learner's ingest drops it after its stream timeout; finished ones were
  stored). A node lost (its raylet and every process on it) is the same for its actors: Ray
  restarts them on the nodes left.

This command is Ray's driver: it waits for the learner, then stops the actors. A learner that
dies (its process, or its node) ends the command with exit status 1; running the same command
again resumes from the last complete checkpoint in the run directory, as a local run does. The
run directory must be on a file system the learner's node sees (shared storage on a multi-node
cluster).

``memoire sweep run --launcher ray`` runs each index as a Ray task (``--cpus``/``--gpus`` each),
which runs ``memoire train`` for that index exactly as the local launcher does (same command,
same ``train.log``, same records; run again, an index resumes from its checkpoints).

``ray.init(address=RayConfig.address)``: '' starts a local Ray cluster for the command (and
stops it at the end); 'auto' or 'HOST:PORT' joins a running cluster (``ray start --head`` on one
node, ``ray start --address HOST:PORT`` on the others). Ray is optional: ``pip install
memoire[ray]``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
import socket
import tempfile
import threading
import time
from typing import Any, Optional

import gin

from memoire import cli, transport
from memoire.experiments import distributed, ray_report

log = logging.getLogger(__name__)

NAMESPACE = "memoire"
INSTALL_HINT = "the Ray launcher needs Ray: pip install memoire[ray]"
NODE_ID_LABEL = "ray.io/node-id"  # the label Ray gives every node: its node id
# Seconds a HOST:PORT address has to accept a connection before the command says nothing
# answers there (Ray itself would retry for a minute).
REACH_S = 3.0
# Seconds the driver waits for the learner, or the actors, to be given processes before it says
# which still wait and for what (a process Ray can place starts within a second or two).
PLACEMENT_WAIT_S = 10.0


@gin.configurable(module="memoire.ray")
class RayConfig:
    """Where and with what resources the Ray launcher runs (all gin-bindable).

    Args:
      address: Ray cluster to join ('auto', 'HOST:PORT'); '' starts a local one.
      learner_cpus: CPUs Ray reserves for the learner.
      learner_gpus: GPUs (accelerators) Ray reserves for the learner (may be fractional).
      actor_cpus: CPUs Ray reserves for each actor.
      actor_restarts: times Ray restarts an actor whose process died or whose loop raised
        (-1: without limit).
      learner_host: the address the learner binds on; 'auto' is loopback on a cluster of
        this machine alone (one this command starts, or ``ray start`` nodes of one machine),
        else the learner's node address as the cluster registered it.
      learner_resources: custom Ray resources the learner asks for, e.g. ``{'learner': 1}``
        for the node started with ``ray start --resources '{"learner": 1}'`` (with
        ``learner_gpus``, the node with GPUs).
      actors_apart: put actors on nodes other than the learner's while the cluster has such
        nodes with room (Ray's label selector on the node id, within Ray's ``SPREAD``); when
        none can take an actor (its node was lost, the others are full) it goes on any node,
        the learner's included. False: ``SPREAD`` alone.
      curve: CURVE keys for the learner's sockets: 'auto' when they bind beyond loopback
        (:func:`memoire.transport.beyond_loopback`), 'on' always, 'off' never (``memoire train
        --insecure``). The keys are made for the run in memory and handed to the learner and
        actors through Ray; they are never written to the run directory.

    Raises:
      ValueError: on negative resources, restarts below -1 or an unknown ``curve``.
    """

    def __init__(
        self,
        address: str = "",
        learner_cpus: float = 1.0,
        learner_gpus: float = 0.0,
        actor_cpus: float = 1.0,
        actor_restarts: int = 3,
        learner_host: str = "auto",
        learner_resources: Optional[dict] = None,
        actors_apart: bool = True,
        curve: str = "auto",
    ):
        for name, v in (
            ("learner_cpus", learner_cpus),
            ("learner_gpus", learner_gpus),
            ("actor_cpus", actor_cpus),
        ):
            if v < 0:
                raise ValueError(f"{name} must be >= 0, got {v}")
        if actor_restarts < -1:
            raise ValueError(f"actor_restarts must be >= -1, got {actor_restarts}")
        resources = dict(learner_resources or {})
        for name, v in resources.items():
            if not isinstance(name, str) or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(
                    f"learner_resources: expected {{name: amount >= 0}}, got {name!r}: {v!r}"
                )
        if curve not in distributed.CURVE_SETTINGS:
            raise ValueError(f"curve must be one of {distributed.CURVE_SETTINGS}, got {curve!r}")
        self.learner_resources = {k: float(v) for k, v in resources.items()}
        self.actors_apart = bool(actors_apart)
        self.curve = curve
        self.address = address or ""
        self.learner_cpus = float(learner_cpus)
        self.learner_gpus = float(learner_gpus)
        self.actor_cpus = float(actor_cpus)
        self.actor_restarts = int(actor_restarts)
        self.learner_host = learner_host


def import_ray():
    """Returns the ``ray`` module.

    Raises:
      cli.UsageError: with :data:`INSTALL_HINT` when Ray is not installed.
    """
    try:
        import ray
    except ImportError:
        raise cli.UsageError(INSTALL_HINT) from None
    return ray


# Ray's token authentication (Ray 2.60): what a refused connection says, and the fix.
_AUTH_REFUSED = ("Unauthenticated", "InvalidAuthToken", "AuthenticationError")
AUTH_HINT = (
    "the cluster uses Ray's token authentication: export RAY_AUTH_MODE=token, and put the "
    "cluster's token (the head's ~/.ray/auth_token) in ~/.ray/auth_token here, or point "
    "RAY_AUTH_TOKEN_PATH at it"
)


def connect(address: str, cpus_needed: float = 0.0) -> bool:
    """Connects this process to Ray (``address`` '' starts a local cluster with at least
    ``cpus_needed`` logical CPUs, so a run that the local launcher would start here also fits
    Ray's bookkeeping). Returns True when this call connected the process (``ray.init``: a
    cluster of its own, or one joined); the caller then calls ``ray.shutdown()`` at the end.

    Ray's own output stays out below ``--log-level debug`` (its loggers at ERROR, its C++
    logging at error, the cluster's output through :func:`ray_report.forward_worker_output`).

    Raises:
      cli.UsageError: one line: no cluster at ``address``, nothing listening there, or the
        cluster refused this process (token authentication), with what to do.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    quiet = ray_report.quiet()
    if quiet:  # as TF_CPP_MIN_LOG_LEVEL for TensorFlow: the user's own setting wins
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
    kwargs: dict[str, Any] = {
        "namespace": NAMESPACE,
        "log_to_driver": True,
        "logging_level": logging.ERROR if quiet else logging.INFO,
    }
    if address:
        _check_reachable(address)
        kwargs["address"] = address
    else:  # a cluster of this machine alone: keep it on loopback, without its dashboard
        kwargs.update(
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            num_cpus=max(os.cpu_count() or 1, math.ceil(cpus_needed)),
        )
    kwargs.update(_off_the_checkout())
    said: list = []
    try:
        # The driver's C++ side logs to stderr as it starts (each refused attempt to join, its
        # log level): held, to tell an authentication refusal from other failures, and written
        # out without Ray's own lines (Ray's daemons and workers log to their own files).
        with _held_stderr(said):
            ray.init(**kwargs)
    except ConnectionError as e:
        raise cli.UsageError(_connect_error(address, e, "".join(said))) from None
    except Exception as e:  # noqa: BLE001 - e.g. ray.exceptions.AuthenticationError
        if any(word in f"{type(e).__name__} {e}" for word in _AUTH_REFUSED):
            raise cli.UsageError(f"--ray_address {address or '(none)'}: {AUTH_HINT}") from None
        raise
    ray_report.forward_worker_output()
    return True


def _check_reachable(address: str) -> None:
    """For a ``HOST:PORT`` address: something accepts a TCP connection there within
    :data:`REACH_S` seconds (Ray would try for a minute before saying no).

    Raises:
      cli.UsageError: nothing listens there, or nothing answers.
    """
    host, sep, port = address.rpartition(":")
    if address == "auto" or "://" in address or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=REACH_S).close()
    except ConnectionRefusedError:
        raise cli.UsageError(
            f"--ray_address {address}: nothing listens there; start the head there "
            f"(ray start --head --port {port}), or give the address its `ray start --head` printed"
        ) from None
    except OSError as e:  # a timeout, an unknown host, an unreachable network
        raise cli.UsageError(
            f"--ray_address {address}: cannot reach it ({e or 'no answer in %g s' % REACH_S}); "
            "check the head's address and that its port is open to this machine"
        ) from None


def _connect_error(address: str, error: Exception, said: str) -> str:
    """The one line of a failed ``ray.init``: why, and what to do."""
    if any(word in said for word in _AUTH_REFUSED):
        return f"--ray_address {address}: the cluster refused this process; {AUTH_HINT}"
    if address == "auto":
        return (
            "--ray_address auto: no Ray cluster runs on this machine; start one (ray start "
            "--head), give the head's HOST:PORT, or leave --ray_address out for a cluster of "
            "this command's own"
        )
    return f"--ray_address {address or '(none)'}: {cli.one_line(error)}"


def _held_stderr(said: list):
    """Holds what is written to file descriptor 2 while the block runs and appends it to
    ``said``; afterwards writes out what is not Ray's own logging below ERROR (all of it with
    ``--log-level debug``)."""
    return cli.hold_stderr(
        lambda line: ray_report.quiet() and ray_report.is_ray_line(line), said=said
    )


def _off_the_checkout() -> dict:
    """Ray puts the driver's working directory on its workers' sys.path unless the job's
    runtime_env has a working_dir. Started from a source checkout (a ``memoire/`` folder here),
    workers would import the checkout's memoire/, which holds no built extension when memoire
    is installed: an empty working_dir keeps it off their path."""
    if not os.path.isdir(os.path.join(os.getcwd(), "memoire")):
        return {}
    return {"runtime_env": {"working_dir": tempfile.mkdtemp(prefix="memoire-ray-job-")}}


def actor_name(run_dir: str, actor_id: int) -> str:
    """The Ray name of actor ``actor_id`` of the run in ``run_dir`` (namespace ``memoire``)."""
    return f"memoire-actor-{actor_id}:{os.path.abspath(run_dir)}"


def learner_name(run_dir: str) -> str:
    """The Ray name of the learner of the run in ``run_dir`` (namespace ``memoire``)."""
    return f"memoire-learner:{os.path.abspath(run_dir)}"


# ---------------------------------------------------------------------------------------------
# The processes Ray starts. Plain classes here; `ray.remote` wraps them when a launch needs them,
# so importing this module does not import Ray.


def _prepare_process(facts: dict) -> None:
    """What ``memoire train`` does in its own process before training: logging, gin, seeds,
    TF's graph mode (Dopamine's train.py), in a process Ray started."""
    from absl import logging as absl_logging

    from memoire.experiments import runner

    cli.configure_logging()
    absl_logging.set_verbosity(absl_logging.WARNING)
    runner.load_gin(facts["gin_files"], facts["bindings"])
    runner.seed_everything(facts["seed"])
    import tensorflow as tf

    tf.compat.v1.disable_v2_behavior()


def _node_address() -> str:
    """The address of the node this Ray worker runs on, as the cluster registered it (what
    ``ray start --node-ip-address`` said), else the one Ray finds for this process."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    for entry in ray.nodes():
        if entry.get("NodeID") == node and entry.get("NodeManagerAddress"):
            return entry["NodeManagerAddress"]
    return ray.util.get_node_ip_address()


class LearnerProcess:
    """The learner in a Ray actor: binds its sockets when built; :meth:`run` trains."""

    def __init__(
        self,
        facts: dict,
        config: distributed.DistributedConfig,
        host: str,
        keys: Optional[transport.CurveKeys] = None,
        curve: str = "auto",
    ):
        if host == "auto":
            host = _node_address()
        _prepare_process(facts)
        self._facts = facts
        self._config = config
        keys = keys if distributed.use_curve(curve, host) else None
        self._sockets = distributed.LearnerSockets(config, host=host, keys=keys)
        self._host = host
        self._actors_gone = threading.Event()
        self._actors_report = ""

    def endpoints(self) -> dict:
        """``{'experience': 'tcp://IP:PORT', 'params': 'tcp://IP:PORT'}``, as actors reach
        them (a socket bound on every interface is reached at this node's address)."""
        out = {}
        for key, endpoint in self._sockets.endpoints.items():
            for anywhere in ("tcp://0.0.0.0:", "tcp://*:"):
                if endpoint.startswith(anywhere):
                    import ray

                    host = self._host
                    if host in ("0.0.0.0", "*"):
                        host = ray.util.get_node_ip_address()
                    endpoint = f"tcp://{host}:{endpoint[len(anywhere) :]}"
            out[key] = endpoint
        return out

    def encrypted(self) -> bool:
        """Whether the sockets use the run's CURVE keys."""
        return self._sockets.encrypted

    def refused(self) -> int:
        """Connections the sockets refused (no or wrong CURVE keys)."""
        return self._sockets.refused

    def node(self) -> str:
        """The id of the Ray node this process runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def actors_gone(self) -> None:
        """Told by the driver when every actor has ended for good: the learner stops waiting."""
        self._actors_gone.set()

    def set_actors_report(self, text: str) -> None:
        """Told by the driver: what Ray did with the actors (:meth:`ActorWatch.report`), for
        the learner's closing line."""
        self._actors_report = str(text)

    def run(self, actors_label: str) -> int:
        try:
            distributed.run_learner(
                self._facts,
                self._config,
                self._sockets,
                actors_label,
                lambda: not self._actors_gone.is_set(),
                lambda: self._actors_report,
            )
        finally:
            self._sockets.stop_actors()
            time.sleep(0.2)  # let the stop notice leave before the socket closes
            self._sockets.close()
        return 0


class _CountingLink(distributed.ActorLink):
    """An :class:`~memoire.experiments.distributed.ActorLink` that counts the chunks it sent."""

    chunks = 0

    def send(self, frames: list) -> bool:
        ok = super().send(frames)
        self.chunks += ok
        return ok


class _RayEndpoints(distributed.ActorEndpoints):
    def open(self, actor_id: int = 0) -> distributed.ActorLink:
        self.link = _CountingLink(self, actor_id)
        return self.link


class ActorProcess:
    """An actor in a Ray actor. Its loop starts in the constructor, so a process Ray restarts
    after a crash acts again without being asked (it joins as a new stream)."""

    def __init__(self, actor_id: int, facts: dict, config: dict, endpoints: dict):
        self._endpoints = _RayEndpoints(**endpoints)
        self._thread = threading.Thread(
            target=self._act,
            name=f"memoire-actor-{actor_id}",
            daemon=True,
            args=(actor_id, facts, config),
        )
        self._thread.start()

    def _act(self, actor_id: int, facts: dict, config: dict) -> None:
        try:
            distributed.actor_main(actor_id, facts, config, self._endpoints)
        except distributed.NoLearner as e:  # the process ends, so Ray restarts it
            log.error("actor %d: %s; its process exits", actor_id, e)
            os._exit(1)
        except BaseException:  # the process ends, so Ray restarts it (within actor_restarts)
            log.exception("actor %d failed; its process exits", actor_id)
            os._exit(1)

    def chunks_sent(self) -> int:
        """Chunk messages this process has sent so far (0 before it connected)."""
        link = getattr(self._endpoints, "link", None)
        return link.chunks if link is not None else 0

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        """The id of the Ray node this process runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def join(self) -> int:
        """Waits until the actor's loop ends (the learner's stop notice, or it gave up)."""
        while self._thread.is_alive():
            self._thread.join(timeout=1.0)
        return self.chunks_sent()


# ---------------------------------------------------------------------------------------------
# memoire train --launcher ray


def actor_placement(ray_config: RayConfig, learner_node: str) -> dict:
    """Ray options that place actors: ``SPREAD`` over the cluster's nodes, and with
    ``actors_apart`` away from the learner's node (``learner_node``, a Ray node id) as long as
    another node can take them: a node lost later does not strand its actors, Ray restarts
    them wherever there is room."""
    options: dict[str, Any] = {"scheduling_strategy": "SPREAD"}
    if ray_config.actors_apart:
        options["label_selector"] = {NODE_ID_LABEL: f"!{learner_node}"}
        options["fallback_strategy"] = [{"label_selector": {}}]  # any node
    return options


@dataclasses.dataclass
class Session:
    """A Ray connection checked for a run (:func:`open_session`)."""

    ray_config: RayConfig
    connected_here: bool  # this command called ray.init (it lets go at the end)

    @property
    def local(self) -> bool:
        """A cluster of this machine alone: one this command started (no --ray_address), or
        one whose nodes, live or lost, all had one address (``ray start`` nodes of one
        machine). Its learner stays on loopback; on a cluster of several hosts it binds its
        node's address. (A node of another host that joins later finds the learner on
        loopback: give ``RayConfig.learner_host`` for such a cluster.)"""
        if not self.ray_config.address:
            return True
        import ray

        return len({node.get("NodeManagerAddress") for node in ray.nodes()}) == 1

    def close(self) -> None:
        if self.connected_here:
            import ray

            ray.shutdown()


def _placement_fix(what: str, want: dict, why: str, session_address: str) -> str:
    """What to do about a process no node can hold."""
    custom = [k for k in want if k not in ("CPU", "GPU")]
    if not session_address and custom:
        return (
            "a cluster this command starts for itself has no custom resources: give "
            "--ray_address of a cluster with such a node"
        )
    if "no node of the cluster has" in why and custom:
        amounts = ", ".join(f'"{k}": {want[k]:g}' for k in custom)
        return (
            f"start such a node (ray start --address HEAD:PORT --resources '{{{amounts}}}'), "
            f"or change {what}"
        )
    return f"lower {what}, or add a node that has that much"


def open_session(config: distributed.DistributedConfig) -> Session:
    """Connects to Ray (:func:`connect`) and checks that some node can hold the learner and
    some node an actor, before anything is written or started.

    Raises:
      cli.UsageError: no cluster (see :func:`connect`), or a process no node of the cluster
        can ever hold (a custom resource no node has, more than any node has), naming the
        resource and the fix.
    """
    ray_config = RayConfig()
    connected_here = connect(
        ray_config.address, ray_config.learner_cpus + config.num_actors * ray_config.actor_cpus
    )
    session = Session(ray_config, connected_here)
    try:
        nodes = ray_report.alive_nodes()
        asks = (
            (
                "the learner",
                "RayConfig.learner_resources"
                if ray_config.learner_resources
                else "RayConfig.learner_cpus / learner_gpus",
                ray_report.demand(
                    ray_config.learner_cpus,
                    ray_config.learner_gpus,
                    ray_config.learner_resources,
                ),
            ),
            (
                "each actor",
                "RayConfig.actor_cpus",
                ray_report.demand(ray_config.actor_cpus),
            ),
        )
        for role, setting, want in asks:
            why = ray_report.never_placed(want, nodes)
            if why:
                raise cli.UsageError(
                    f"{role} asks Ray for {ray_report.resources_text(want)} ({setting}), and "
                    f"{why}: {_placement_fix(setting, want, why, ray_config.address)}"
                )
    except BaseException:
        session.close()
        raise
    return session


def _await_learner(learner, want: dict) -> dict:
    """The learner's endpoints, once it runs; says once what it waits for when no node has
    room for it within :data:`PLACEMENT_WAIT_S` seconds."""
    import ray

    ref = learner.endpoints.remote()
    start, said = time.monotonic(), False
    while not ray.wait([ref], timeout=1.0)[0]:
        if said or time.monotonic() - start < PLACEMENT_WAIT_S:
            continue
        if not ray_report.queued(want):
            continue  # placed: its process is starting (TensorFlow, JAX, gin)
        nodes = ray_report.alive_nodes()
        log.info(
            "ray: the learner waits for a node with %s free (%s)",
            ray_report.resources_text(want),
            ray_report.free_text(want, nodes),
        )
        said = True
    return ray.get(ref)


def _await_placement(watch: ray_report.ActorWatch, want: dict) -> None:
    """Waits until every actor has a process or waits in a raylet's queue for room (asking for
    ``want``), at most :data:`PLACEMENT_WAIT_S` seconds; then says how many are placed, and
    what the others wait for."""
    deadline = time.monotonic() + PLACEMENT_WAIT_S
    while True:
        watch.poll(say=False)
        pending = watch.pending()
        # Done when each actor has its process or waits in a raylet's queue for room (one
        # given room, whose process is starting, is in neither yet).
        if len(pending) <= ray_report.queued(want) or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    nodes = ray_report.alive_nodes()
    total = len(pending) + len(watch.placed)
    if not pending:
        log.info("ray: %d of %d actors placed", total, total)
        return
    log.warning(
        "ray: %d of %d actors placed, %d pending: each asks for %s and the cluster has %s; "
        "they start when room frees or a node joins",
        len(watch.placed),
        total,
        len(pending),
        ray_report.resources_text(want),
        ray_report.free_text(want, nodes),
    )


def run(
    facts: dict, config: distributed.DistributedConfig, session: Optional[Session] = None
) -> int:
    """Runs the learner and ``config.num_actors`` actors on Ray (see the module docstring),
    in ``session`` (None: :func:`open_session` here), and reports what Ray did: where the
    learner runs, how many actors were placed and why others wait, each actor lost or
    restarted (one line each), and those counts in the learner's closing line.

    Returns 0 when the learner finished, 1 when it died (the command can be run again to
    resume).
    """
    ray = import_ray()
    from ray.exceptions import RayActorError, RayTaskError

    session = session or open_session(config)
    ray_config = session.ray_config
    facts = dict(
        facts,
        dir=os.path.abspath(facts["dir"]),
        gin_files=[os.path.abspath(f) for f in facts["gin_files"]],
    )
    config = copy.copy(config)
    config.transport = "zmq"  # actors may be on other nodes: TCP, not ipc://
    host = ray_config.learner_host
    if host == "auto" and session.local:
        host = "127.0.0.1"
    server_keys, client_keys = transport.run_keys() if ray_config.curve != "off" else (None, None)
    learner_cls = ray.remote(LearnerProcess).options(
        name=learner_name(facts["dir"]),
        num_cpus=ray_config.learner_cpus,
        num_gpus=ray_config.learner_gpus,
        resources=ray_config.learner_resources,
        max_restarts=0,
        max_concurrency=4,  # run() with actors_gone(), set_actors_report(), node(), refused()
    )
    actor_cls = ray.remote(ActorProcess)
    learner = learner_cls.remote(facts, config, host, server_keys, ray_config.curve)
    actors: list = []
    learner_died = (
        "the learner's process died; run the same command again to resume from its last "
        f"checkpoint in {facts['dir']}"
    )
    try:
        try:
            endpoints = _await_learner(
                learner,
                ray_report.demand(
                    ray_config.learner_cpus, ray_config.learner_gpus, ray_config.learner_resources
                ),
            )
        except RayActorError as e:  # its constructor failed (gin, a socket) or its node died
            first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
            log.error("the learner did not start: %s", first)
            return 1
        actor_endpoints = dict(
            endpoints,
            queue_chunks=config.queue_chunks,
            episodes_ahead=config.episodes_ahead,
            keys=client_keys if ray.get(learner.encrypted.remote()) else None,
        )
        warning = distributed.insecure_warning(ray_config.curve, actor_endpoints["experience"])
        if warning:
            log.warning("%s", warning)
        learner_node = ray.get(learner.node.remote())
        log.info(
            "ray: the learner runs on %s (experience %s, parameters %s, %s)",
            ray_report.node_name(learner_node, ray_report.alive_nodes()),
            actor_endpoints["experience"],
            actor_endpoints["params"],
            "CURVE keys of the run" if actor_endpoints["keys"] is not None else "no CURVE",
        )
        placement = actor_placement(ray_config, learner_node)
        actor_facts = {k: facts[k] for k in ("gin_files", "bindings", "seed")}
        for i in range(config.num_actors):
            actors.append(
                actor_cls.options(
                    # max_concurrency: chunks_sent(), pid() and node() answer while join() waits
                    name=actor_name(facts["dir"], i),
                    max_concurrency=4,
                    num_cpus=ray_config.actor_cpus,
                    max_restarts=ray_config.actor_restarts,
                    max_task_retries=-1,
                    **placement,
                ).remote(i, actor_facts, config.as_dict(), actor_endpoints)
            )
        watch = ray_report.ActorWatch(actors, ray_config.actor_restarts)
        _await_placement(watch, ray_report.demand(ray_config.actor_cpus))
        learner.set_actors_report.remote(watch.report())
        done = learner.run.remote(f"{len(actors)} Ray actor(s)")
        joins = [a.join.remote() for a in actors]
        told = False
        while not ray.wait([done], timeout=1.0)[0]:
            if watch.poll():
                learner.set_actors_report.remote(watch.report())
            if (
                not told
                and joins
                and len(ray.wait(joins, num_returns=len(joins), timeout=0)[0]) == len(joins)
            ):
                learner.actors_gone.remote()  # every actor ended for good
                told = True
        try:
            ray.get(done)
        except RayActorError:
            log.error("%s", learner_died)
            return 1
        except RayTaskError as e:  # the learner raised: Ray's message holds its traceback
            if isinstance(e.cause, distributed.NoActors):
                log.error("the learner stops: %s", e.cause)
            else:
                log.error("the learner failed: %s", e)
            return 1
        ray.wait(joins, num_returns=len(joins), timeout=15.0)  # actors heard the stop notice
        return 0
    finally:
        for a in actors:
            ray.kill(a, no_restart=True)
        ray.kill(learner, no_restart=True)
        session.close()


# ---------------------------------------------------------------------------------------------
# memoire sweep run --launcher ray


def _run_command(command: list, log_path: str) -> int:
    """A Ray task: runs one sweep index's ``memoire train`` with its output appended to
    ``log_path``; returns its exit status."""
    import subprocess

    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as log_file:
        return subprocess.run(command, stdout=log_file, stderr=subprocess.STDOUT).returncode


def run_sweep(jobs: list, *, address: str = "", cpus: float = 1.0, gpus: float = 0.0):
    """Runs sweep jobs as Ray tasks, as many at once as the cluster's resources allow.

    Args:
      jobs: ``(index, command, log_path)`` per index (``memoire train`` for that index).
      address: the Ray cluster ('' starts a local one for the call).
      cpus, gpus: resources of each task.

    Yields:
      ``(index, exit status)`` as each task ends (-1: Ray could not run it).
    """
    ray = import_ray()
    connected_here = connect(address, cpus)
    try:
        task = ray.remote(_run_command).options(num_cpus=cpus, num_gpus=gpus, max_retries=0)
        refs = {task.remote(command, log_path): index for index, command, log_path in jobs}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            index = refs[ready[0]]
            try:
                code = int(ray.get(ready[0]))
            except ray.exceptions.RayError as e:
                log.error("index %d: Ray could not run it: %s", index, cli.one_line(e))
                code = -1
            yield index, code
    finally:
        if connected_here:
            ray.shutdown()
