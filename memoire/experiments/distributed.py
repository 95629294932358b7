"""Distributed training: one learner, N actor processes, from the same gin file.

Roles:

- **Actors** run the environment the gin configuration names (what Dopamine's runner would
  build: its ``create_environment_fn``, by default Atari with the gin-bound game; see
  :func:`memoire.experiments.runner.environment_fn`) with the agent's epsilon-greedy policy on
  the learner's latest network parameters. An actor is the gin-configured Dopamine agent whose
  replay memory is a :class:`memoire.experience.ChunkStream`: the agent's own
  ``begin_episode``/``step``/``end_episode`` choose actions and build transitions exactly as in
  a single process, and each transition is streamed to the learner; nothing is trained there.
- **The learner** is Dopamine's Runner (TrainRunner under ``create_runner.schedule =
  'continuous_train'``) with memoire's trackers, whose training phase takes actors' episodes
  instead of stepping an environment. Experience takes memoire's one path: chunk messages on a
  ZeroMQ PULL socket, checked and stored whole by the native ingest straight into the agent's
  replay buffer (memoire's JAX ``ReplayBuffer.chunk_ingest``), with the GIL released. After
  each stored episode the learner runs one ``_train_step`` per transition (so
  ``update_period`` and ``min_replay_history`` keep their single-process meaning, counted in
  transitions), and every ``publish_period`` training steps it publishes the online
  parameters on a PUB socket. The evaluation phase and checkpoints (replay memory included)
  are Dopamine's, so a killed run resumes like a local one.

Sockets: the learner binds both. ``transport = 'multiprocessing'`` (actors spawned on this
machine) uses ``ipc://`` endpoints in a private temporary folder; ``'zmq'`` uses TCP (loopback
ports the OS picks unless ``experience_endpoint`` / ``param_endpoint`` name them), so actors on
other machines can join with ``memoire actor``. Backpressure: the learner publishes, per actor,
the last episode it stored, and an actor starts a new episode only while at most
``episodes_ahead`` of its finished episodes are not stored yet, so actors never run ahead of
the learner by more than that (socket queues alone would not bound it: the kernel's buffers
hold thousands of small chunks). When the learner ends it publishes a stop notice, and a
spawned actor also has a stop event. Parameters travel as ``flax.serialization.to_bytes``
(msgpack), never pickle.

Gin settings (``DistributedConfig.*``): ``num_actors`` (0 = single process), ``publish_period``,
``chunk_size``, ``queue_chunks``, ``episodes_ahead``, ``transport``, ``experience_endpoint``,
``param_endpoint``,
``actor_threads``, ``spawn_actors``, ``launcher``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import shutil
import struct
import tempfile
import time
from typing import Any, Optional

import gin
import numpy as np
import zmq

import memoire.dopamine_compat  # noqa: F401  first: its upstream_compat steps precede Dopamine's import
from memoire import cli, transport
from memoire.experience import ChunkStream, ExperienceReceiver
from memoire.gin_query import query

log = logging.getLogger(__name__)

CURVE_SETTINGS = ("auto", "on", "off")  # RayConfig.curve, SlurmConfig.curve


def use_curve(setting: str, host: str) -> bool:
    """Whether a learner binding on ``host`` uses CURVE keys under a launcher's ``curve``
    ``setting``: 'auto' when ``host`` is beyond loopback, 'on' always, 'off' never."""
    if setting not in CURVE_SETTINGS:
        raise ValueError(f"curve must be one of {CURVE_SETTINGS}, got {setting!r}")
    return setting == "on" or (setting == "auto" and transport.beyond_loopback(host))


def insecure_warning(setting: str, endpoint: str) -> Optional[str]:
    """The one warning of a run whose learner binds ``endpoint`` beyond loopback without keys
    (``--insecure``); None when there is nothing to say."""
    if setting != "off" or not transport.beyond_loopback(endpoint):
        return None
    return (
        f"--insecure: the learner's sockets ({endpoint}) take experience and send parameters "
        "in clear, and anyone who reaches them can connect"
    )


# An actor waits this long for its first connection to the learner before it gives up (the
# learner binds before any actor starts, so a connection comes at once when it is there).
LEARNER_WAIT_S = 5.0
# An actor whose learner takes nothing of it for this long stops (the learner is gone).
LEARNER_SILENCE_S = 60.0

PARAMS_TOPIC = b"params"
STOP_TOPIC = b"stop"
STORED_TOPIC = b"stored"  # uint64 pairs (actor uuid, last episode stored)
MAX_ACTORS = 4096  # actors the learner tells about their stored episodes
PUB_HWM = 16  # publications queued per actor at the learner (parameters, tables, stop)
_VERSION = struct.Struct("<q")  # parameter version, before the payload
LAUNCHERS = ("local", "ray", "slurm")  # who starts a distributed run's learner and actors


@gin.configurable(module="memoire.distributed")
class DistributedConfig:
    """Settings of a distributed launch (all gin-bindable).

    Args:
      num_actors: actor processes; 0 runs everything in one process.
      publish_period: learner training steps between parameter publications.
      chunk_size: transitions per experience chunk an actor sends (an episode end also sends).
      queue_chunks: chunks an actor's socket queues before a send waits.
      episodes_ahead: finished episodes an actor may have that the learner has not stored yet
        when it starts the next one (0: lockstep); bounds how stale the learner's data is.
      transport: 'multiprocessing' (actors spawned on this machine, ``ipc://`` sockets) or
        'zmq' (TCP sockets; actors may run on other machines).
      experience_endpoint: the learner's PULL endpoint for experience ('zmq'); 'auto' lets the
        OS choose a loopback port.
      param_endpoint: the learner's PUB endpoint for parameters ('zmq'); 'auto' too.
      actor_threads: XLA CPU threads per actor process (actors only run small forward passes).
      spawn_actors: False starts no actor here: actors on this or other machines join with
        ``memoire actor --experience ... --params ...`` (transport 'zmq'; bind the endpoints to
        an interface they can reach, e.g. 'tcp://0.0.0.0:5555').
      launcher: 'local' (actor processes spawned here), 'ray' (the learner and the actors
        are Ray actors on a Ray cluster, see :mod:`memoire.experiments.ray_launcher`; needs
        ``pip install memoire[ray]``) or 'slurm' (the learner and the actors are the tasks of
        one SLURM job, see :mod:`memoire.experiments.slurm_launcher`).
      samples_per_insert: the replay ratio the learner keeps with memoire's rate limiter
        (:func:`memoire.rate_limiter.SampleToInsertRatio`): transitions sampled per
        transition stored (a gradient update samples one batch; DQN's batch 32 every 4 steps
        is 8). The learner then trains whenever the limiter allows, also while actors are
        slow, and stops taking experience while it is behind (actors wait on their sockets).
        0 (default): one training step per stored transition, as Dopamine's own loop.
      rate_error_buffer: the limiter's margin in samples (0: 100 batches).
      keepalive: seconds an actor with an open episode and nothing to send waits before it
        sends a KEEPALIVE on its experience channel (:class:`memoire.experience.Keepalive`).
      peer_timeout: seconds of the learner's listening after which an actor not heard from
        (killed, frozen) has its open episode dropped, and only its (docs/LIMITS.md).

    Raises:
      ValueError: on a negative count, a period or size below 1, or an unknown transport.
    """

    def __init__(
        self,
        num_actors: int = 0,
        publish_period: int = 100,
        chunk_size: int = 64,
        queue_chunks: int = 32,
        episodes_ahead: int = 1,
        transport: str = "multiprocessing",
        experience_endpoint: str = "auto",
        param_endpoint: str = "auto",
        actor_threads: int = 1,
        spawn_actors: bool = True,
        launcher: str = "local",
        samples_per_insert: float = 0.0,
        rate_error_buffer: float = 0.0,
        keepalive: float = transport.KEEPALIVE_S,
        peer_timeout: float = transport.PEER_TIMEOUT_S,
    ):
        if num_actors < 0:
            raise ValueError(f"num_actors must be >= 0, got {num_actors}")
        if episodes_ahead < 0:
            raise ValueError(f"episodes_ahead must be >= 0, got {episodes_ahead}")
        for name, v in (
            ("publish_period", publish_period),
            ("chunk_size", chunk_size),
            ("queue_chunks", queue_chunks),
            ("actor_threads", actor_threads),
        ):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        for name, v in (
            ("samples_per_insert", samples_per_insert),
            ("rate_error_buffer", rate_error_buffer),
        ):
            if not (0 <= float(v) < float("inf")):
                raise ValueError(f"{name} must be finite and >= 0, got {v}")
        for name, v in (("keepalive", keepalive), ("peer_timeout", peer_timeout)):
            if not (0 < float(v) < float("inf")):
                raise ValueError(f"{name} must be finite seconds > 0, got {v}")
        if float(keepalive) >= float(peer_timeout):
            raise ValueError(
                f"keepalive ({keepalive} s) must be shorter than peer_timeout ({peer_timeout} s)"
            )
        self.keepalive = float(keepalive)
        self.peer_timeout = float(peer_timeout)
        self.samples_per_insert = float(samples_per_insert)
        self.rate_error_buffer = float(rate_error_buffer)
        if transport not in ("multiprocessing", "zmq"):
            raise ValueError(f"transport must be 'multiprocessing' or 'zmq', got {transport!r}")
        self.num_actors = int(num_actors)
        self.publish_period = int(publish_period)
        self.chunk_size = int(chunk_size)
        self.queue_chunks = int(queue_chunks)
        self.episodes_ahead = int(episodes_ahead)
        self.transport = transport
        self.experience_endpoint = experience_endpoint
        self.param_endpoint = param_endpoint
        self.actor_threads = int(actor_threads)
        self.spawn_actors = bool(spawn_actors)
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
        self.launcher = launcher
        if not self.spawn_actors and transport != "zmq":
            raise ValueError(
                "spawn_actors=False needs transport 'zmq' (actors started by "
                "endpoint with `memoire actor`)"
            )

    def as_dict(self) -> dict:
        return dict(vars(self))


# ---------------------------------------------------------------------------------------------
# Parameters.


def params_to_bytes(params: Any) -> bytes:
    """Serializes a parameter pytree with flax's msgpack format (no pickle)."""
    from flax import serialization

    return serialization.to_bytes(params)


def params_from_bytes(template: Any, payload: bytes) -> Any:
    """Restores parameters shaped like ``template`` from :func:`params_to_bytes` output.

    Raises:
      ValueError: if the payload does not match the template's structure.
    """
    from flax import serialization

    try:
        return serialization.from_bytes(template, payload)
    except Exception as e:  # msgpack and flax raise several types for a bad payload
        raise ValueError(f"parameter payload does not match the agent's parameters: {e}") from e


# ---------------------------------------------------------------------------------------------
# Actor.


# ---------------------------------------------------------------------------------------------
# Sockets.


class LearnerSockets:
    """The learner's sockets: PULL for actors' experience chunks, PUB for parameters and the
    stop notice. Both bound here; :attr:`endpoints` says where (``experience``, ``params``).
    Owned by the learner's thread; :meth:`close` unbinds and removes an ``ipc://`` folder.

    ``keys``: server-side :class:`memoire.transport.CurveKeys` (from
    :func:`memoire.transport.run_keys`): both sockets then take only actors holding the
    run's client keys, encrypted; :attr:`refused` counts the connections they refused."""

    def __init__(
        self,
        config: DistributedConfig,
        host: str = "127.0.0.1",
        keys: Optional[transport.CurveKeys] = None,
    ):
        self._ctx = zmq.Context()
        self._folder = None
        self._auth = transport.Authenticator(self._ctx, keys) if keys is not None else None
        self.encrypted = keys is not None
        if config.transport == "multiprocessing":
            self._folder = tempfile.mkdtemp(prefix="memoire-ipc-")
            experience = f"ipc://{self._folder}/experience"
            params = f"ipc://{self._folder}/params"
        else:
            experience = _endpoint(config.experience_endpoint, host)
            params = _endpoint(config.param_endpoint, host)
        try:
            # The PULL queues transport.RECEIVE_HWM chunks per actor (what waits beyond that
            # waits in the actors' own send queues); a frozen actor's parameter queue at the
            # PUB holds at most PUB_HWM publications (a slow actor skips to the newest).
            self.pull = transport.open_socket(self._ctx, zmq.PULL, experience, "Bind", keys=keys)
            self.pub = transport.open_socket(
                self._ctx, zmq.PUB, params, "Bind", hwm=PUB_HWM, keys=keys
            )
            self._pub_watch = transport.ConnectionWatch(self.pub)
        except Exception:
            self.close()
            raise
        self.endpoints = {
            "experience": transport.last_endpoint(self.pull),
            "params": transport.last_endpoint(self.pub),
        }
        self._watch = transport.ConnectionWatch(self.pull)
        self._stored: collections.OrderedDict = collections.OrderedDict()  # uuid -> episode
        self._told = 0.0

    def publish(self, version: int, payload: bytes) -> None:
        """Sends parameters of training step ``version`` to every actor (slow ones skip to
        the newest)."""
        self.pub.send_multipart([PARAMS_TOPIC, _VERSION.pack(int(version)) + payload])

    def acknowledge(self, stored: list) -> None:
        """Tells actors which of their episodes are stored (``stored``: what
        :meth:`memoire.experience.ExperienceReceiver.poll` returned). The whole table goes out
        when something was stored and at least every 0.5 s, so an actor that joined late or
        missed a message catches up."""
        self.watch()
        for uuid, episode, _, _ in stored:
            uuid = int(uuid)
            self._stored[uuid] = max(int(episode), self._stored.pop(uuid, -1))
            if len(self._stored) > MAX_ACTORS:  # peers are not trusted: the table is bounded
                self._stored.popitem(last=False)  # the actor heard from least recently
        now = time.monotonic()
        if self._stored and (stored or now - self._told >= 0.5):
            table = np.array(list(self._stored.items()), np.uint64)
            self.pub.send_multipart([STORED_TOPIC, table.tobytes()])
            self._told = now

    def actors_seen(self) -> int:
        """Actor connections opened so far (0: no actor has connected yet)."""
        self._watch.poll()
        return self._watch.opened

    def actors_gone(self, grace: float = transport.PEER_TIMEOUT_S) -> bool:
        """True once actors have connected and every connection has been closed for `grace`
        seconds (they exited or were killed: their kernels close the connections); a
        reconnecting actor comes back within that."""
        self._watch.poll()
        w = self._watch
        return w.opened > 0 and w.open == 0 and time.monotonic() - w.last_closed >= grace

    def watch(self) -> None:
        """Reads both sockets' connection events (the learner's loop does, in
        :meth:`acknowledge`): counts and logs the connections refused for their keys."""
        self._watch.poll()
        self._pub_watch.poll()

    @property
    def refused(self) -> int:
        """Connections both sockets refused (no or wrong CURVE keys), as of the last
        :meth:`watch` (read from any thread)."""
        return self._watch.refused + self._pub_watch.refused

    def stop_actors(self) -> None:
        """Tells actors started by endpoint to finish."""
        self.pub.send_multipart([STOP_TOPIC, b""])

    def close(self) -> None:
        for name in ("_watch", "_pub_watch"):
            if getattr(self, name, None) is not None:
                getattr(self, name).close()
        for name in ("pull", "pub"):
            sock = getattr(self, name, None)
            if sock is not None:
                sock.close(0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


@dataclasses.dataclass
class ActorEndpoints:
    """What an actor needs to reach the learner (picklable; also for actors started by hand
    on other machines). ``stop`` is an optional multiprocessing Event set by the learner."""

    experience: str
    params: str
    queue_chunks: int = 32
    episodes_ahead: int = 1
    stop: Any = None
    keepalive: float = transport.KEEPALIVE_S
    keys: Optional[transport.CurveKeys] = None  # client side, when the learner uses CURVE

    def open(self, actor_id: int = 0) -> "ActorLink":
        return ActorLink(self, actor_id)


class NoActors(RuntimeError):
    """The learner has no actor left to take experience from: the run ends with one line."""


# A learner whose actors have sent nothing for this long gives up (seconds).
NO_EXPERIENCE_S = 600.0


class NoLearner(ConnectionError):
    """No learner answered at an actor's experience endpoint (:meth:`ActorLink.connect`)."""


class ActorLink:
    """An actor's sockets: PUSH for its chunks, SUB for parameters, the learner's table of
    stored episodes and the stop notice. :attr:`uuid` is the actor's stream id.

    :meth:`connect` waits for the learner's first connection. ``send`` waits while
    ``queue_chunks`` chunks are queued; :meth:`wait_for_learner` waits while ``episodes_ahead``
    finished episodes are not stored. Both give up after ``give_up_s`` seconds without
    progress (the learner is gone: :attr:`gave_up` says so) or on a stop.
    """

    def __init__(
        self, ends: ActorEndpoints, actor_id: int = 0, give_up_s: float = LEARNER_SILENCE_S
    ):
        # the low half names the actor in the learner's records; the high half tells apart
        # actors started with the same id
        self.uuid = (int.from_bytes(os.urandom(4), "little") << 32) | (int(actor_id) & 0xFFFFFFFF)
        self._ctx = zmq.Context()
        keys = dict(keys=ends.keys, server_side=False)
        # The experience socket is watched from before it connects (connect() reads whether it
        # did): a watch attached later can miss the connection's one event.
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.linger = 0
        self._push.sndhwm = ends.queue_chunks
        if ends.keys is not None:
            ends.keys.apply_client(self._push)
        self._watch: Optional[transport.ConnectionWatch] = transport.ConnectionWatch(self._push)
        self._push.connect(ends.experience)
        self._sub = transport.open_socket(self._ctx, zmq.SUB, ends.params, "Conn", **keys)
        self._sub.setsockopt(zmq.SUBSCRIBE, PARAMS_TOPIC)
        self._sub.setsockopt(zmq.SUBSCRIBE, STOP_TOPIC)
        self._sub.setsockopt(zmq.SUBSCRIBE, STORED_TOPIC)
        self.experience = ends.experience
        self._event = ends.stop
        self._stopped = False
        self.gave_up: Optional[str] = None  # why the link stopped waiting for the learner
        self._newest: Optional[tuple] = None
        self._give_up = give_up_s
        self._ahead = ends.episodes_ahead
        self.keepalive = float(ends.keepalive)
        self.stored_episode = -1  # the last of this actor's episodes the learner stored

    def connect(self, timeout: float = LEARNER_WAIT_S) -> None:
        """Waits until the experience socket has connected to the learner (seconds).

        Raises:
          NoLearner: nothing accepted a connection at the endpoint within `timeout` seconds,
            or the learner refused this actor's handshake (CURVE keys).
        """
        watch = self._watch
        if watch is None:  # connected before
            return
        try:
            deadline = time.monotonic() + timeout
            while True:
                watch.poll()
                if watch.opened:
                    return
                if watch.refused:
                    raise NoLearner(
                        f"the learner at {self.experience} refused this actor's handshake "
                        "(it takes the run's CURVE keys only)"
                    )
                if time.monotonic() >= deadline:
                    raise NoLearner(
                        f"no learner at {self.experience}: nothing accepted a connection in "
                        f"{timeout:g} s; start the learner first, or check the endpoint"
                    )
                time.sleep(0.01)
        finally:
            watch.close()
            self._watch = None

    def should_stop(self) -> bool:
        self._drain()
        return self._stopped or (self._event is not None and self._event.is_set())

    def send(self, frames: list) -> bool:
        """Queues one chunk message (copied); False on a stop or when the learner took
        nothing for ``give_up_s`` seconds."""

        def sent() -> bool:
            try:
                self._push.send_multipart(frames, flags=zmq.NOBLOCK)
                return True
            except zmq.Again:
                return False

        return self._until(sent, "took no experience")

    def try_send(self, frames: list) -> bool:
        """Queues one message if the queue has room now (a keepalive); never waits."""
        try:
            self._push.send_multipart(frames, flags=zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def wait_for_learner(self, finished: int) -> bool:
        """Waits until at most ``episodes_ahead`` of this actor's ``finished`` episodes
        (numbered from 0) are not stored by the learner. False on a stop or when nothing was
        stored for ``give_up_s`` seconds."""
        return self._until(
            lambda: finished - (self.stored_episode + 1) <= self._ahead, "stored nothing of ours"
        )

    def _until(self, ready, what: str) -> bool:
        """Polls ``ready()`` every few ms: True once it is, False on a stop or after
        ``give_up_s`` seconds (the learner is gone: this link then stops)."""
        since = time.monotonic()
        while not self.should_stop():
            if ready():
                return True
            if time.monotonic() - since > self._give_up:
                self.gave_up = f"the learner at {self.experience} {what} for {self._give_up:g} s"
                log.warning("%s; stopping", self.gave_up)
                self._stopped = True
                return False
            time.sleep(0.002)
        return False

    def latest(self) -> Optional[tuple]:
        """``(version, payload)`` of the newest parameters not yet taken, or None."""
        self._drain()
        got, self._newest = self._newest, None
        return got

    def _drain(self) -> None:
        while True:
            try:
                topic, data = self._sub.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            except ValueError:  # not two frames: not ours
                continue
            if topic == STOP_TOPIC:
                self._stopped = True
            elif topic == STORED_TOPIC and len(data) % 16 == 0:
                table = np.frombuffer(data, np.uint64).reshape(-1, 2)
                mine = table[table[:, 0] == np.uint64(self.uuid), 1]
                if mine.size:
                    self.stored_episode = max(self.stored_episode, int(mine.max()))
            elif topic == PARAMS_TOPIC and len(data) >= _VERSION.size:
                (version,) = _VERSION.unpack_from(data)
                self._newest = (version, data[_VERSION.size :])

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self._push.close(0)
        self._sub.close(0)
        self._ctx.term()


def _endpoint(configured: Optional[str], host: str) -> str:
    """The configured endpoint, or an OS-chosen port on ``host`` when it is empty or 'auto'."""
    if not configured or configured == "auto":
        return f"tcp://{host}:*"
    return configured


# ---------------------------------------------------------------------------------------------
# Actor.


def actor_row_spec(agent) -> list:
    """The rows an actor streams, as the learner's buffer takes them
    (:meth:`memoire.dopamine_compat.jax_replay_buffer.ReplayBuffer.chunk_ingest` built from the
    same agent's observation shape and dtype): observation, action int32, reward float64,
    terminal bool."""
    return [
        ("observation", np.dtype(agent.observation_dtype), tuple(agent.observation_shape)),
        ("action", np.dtype(np.int32), ()),
        ("reward", np.dtype(np.float64), ()),
        ("terminal", np.dtype(np.bool_), ()),
    ]


class _StreamingMemory:
    """Stands in for an actor agent's replay memory: streams each transition the agent stores.

    ``add_count`` stays 0, so the agent's ``_train_step`` never trains (it only counts steps,
    which drives the epsilon schedule). The episode's end is sent by the actor loop, which
    knows its return.
    """

    add_count = 0
    _sampling_distribution = None  # the agent's isinstance check for prioritized replay

    def __init__(self, stream: ChunkStream):
        self._stream = stream
        self.ok = True

    def add(self, element, *args, **kwargs) -> None:
        self.ok = (
            self._stream.add(
                {
                    "observation": element.observation,
                    "action": element.action,
                    "reward": element.reward,
                    "terminal": element.is_terminal,
                }
            )
            and self.ok
        )


def environment_from_gin():
    """Builds the environment Dopamine's Runner would for the loaded gin configuration (see
    :func:`memoire.experiments.runner.environment_fn`: the runner's ``create_environment_fn``,
    else Atari with the gin-bound game)."""
    from memoire.experiments.runner import environment_fn

    return environment_fn()()


def run_actor(
    actor_id: int, link: ActorLink, *, chunk_size: int, seed: int, max_steps: int | None = None
) -> int:
    """Runs one actor until the learner says stop, the link gives up, or ``max_steps``
    environment steps.

    Gin must already be loaded. Returns the environment steps taken.
    """
    from memoire.experiments import replay_routing

    environment = environment_from_gin()
    agent = replay_routing.create_agent_fn()(None, environment, summary_writer=None)
    stream = ChunkStream(
        actor_row_spec(agent),
        link.send,
        chunk_rows=chunk_size,
        uuid=link.uuid,
        keepalive=link.keepalive,
        try_send=link.try_send,
    )
    try:
        return _act(agent, environment, link, stream, chunk_size, seed, max_steps)
    finally:
        stream.close()


def _act(agent, environment, link, stream, chunk_size, seed, max_steps) -> int:
    """run_actor's loop (the stream's keepalive thread runs meanwhile)."""
    from memoire.experiments import runner

    memory = _StreamingMemory(stream)
    agent._replay = memory  # the actor trains nothing; its memory only streams
    agent.eval_mode = False
    ends = runner._install_end_recorder(environment)
    runner.seed_environment(environment, seed)
    max_per_episode = query("Runner.max_steps_per_episode", 27000)
    clip = query("Runner.clip_rewards", True)

    def refresh():
        got = link.latest()
        if got is not None:
            version, payload = got
            agent.online_params = params_from_bytes(agent.online_params, payload)
            agent.training_steps = max(agent.training_steps, int(version))

    steps = finished = 0
    refresh()
    while not link.should_stop() and (max_steps is None or steps < max_steps):
        if not link.wait_for_learner(finished):
            return steps
        action = agent.begin_episode(environment.reset())
        length, total = 0, 0.0
        while True:
            observation, reward, _, _ = environment.step(action)
            length += 1
            total += reward
            steps += 1
            clipped = np.clip(reward, -1, 1) if clip else reward
            if (
                environment.game_over
                or (ends is not None and ends.truncated)
                or length == max_per_episode
            ):
                terminated = bool(ends.terminated if ends is not None else environment.game_over)
                agent.end_episode(clipped, terminated)
                memory.ok = stream.end_episode(terminated, info=(total, length, terminated))
                finished += 1
                break
            action = agent.step(clipped, observation)
            if steps % chunk_size == 0:
                refresh()
            if not memory.ok or link.should_stop():
                return steps
        refresh()
    return steps


def actor_main(actor_id: int, facts: dict, config: dict, ends: ActorEndpoints) -> int:
    """Entry point of an actor process: connects (``ends.open()``, then
    :meth:`ActorLink.connect`: one line once connected), loads gin, seeds and runs
    :func:`run_actor`. Returns 0, or 1 when it stopped because the learner went silent
    (:attr:`ActorLink.gave_up`, logged).

    Raises:
      NoLearner: no learner at ``ends.experience`` (before anything heavy is imported).
    """
    cli.configure_logging()  # as every memoire process: level from $MEMOIRE_LOG_LEVEL, no chatter
    os.environ.setdefault(
        "XLA_FLAGS",
        "--xla_cpu_multi_thread_eigen=false "
        f"intra_op_parallelism_threads={config['actor_threads']}",
    )
    link = ends.open(actor_id)
    try:
        link.connect()
        log.info("actor %d connected to the learner at %s", actor_id, ends.experience)
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.WARNING)
        from memoire.experiments import runner

        seed = int(np.random.SeedSequence([facts["seed"], actor_id + 1]).generate_state(1)[0])
        runner.load_gin(facts["gin_files"], facts["bindings"])
        runner.seed_everything(seed)
        run_actor(
            actor_id,
            link,
            chunk_size=config["chunk_size"],
            seed=seed,
            max_steps=config.get("max_steps"),
        )
    except KeyboardInterrupt:
        pass
    finally:
        link.close()
    return 0 if link.gave_up is None else 1


# ---------------------------------------------------------------------------------------------
# Learner.


def _learner_class():
    from memoire.experiments.runner import runner_class

    base = runner_class()  # the schedule's: TrainRunner ('continuous_train') has no eval phase

    class LearnerRunner(base):
        """Dopamine's Runner whose training phase takes actors' episodes."""

        def __init__(
            self,
            base_dir,
            create_agent_fn,
            *,
            sockets: LearnerSockets,
            publish_period: int,
            actors_alive=lambda: True,
            seed=None,
            samples_per_insert: float = 0.0,
            rate_error_buffer: float = 0.0,
            peer_timeout: float = transport.PEER_TIMEOUT_S,
            **kwargs,
        ):
            super().__init__(base_dir, create_agent_fn, seed=seed, **kwargs)
            from dopamine.jax.agents.dqn import dqn_agent

            agent = self._agent
            if not isinstance(agent, dqn_agent.JaxDQNAgent):
                raise ValueError(
                    "distributed training needs a JAX agent (JaxDQNAgent or a "
                    f"subclass), got {type(agent).__name__}"
                )
            if not hasattr(agent._replay, "chunk_ingest"):
                raise ValueError(
                    "distributed training needs memoire's JAX replay buffer "
                    "(memoire.dopamine_compat ReplayBuffer, the default of "
                    f"`memoire train`), got {type(agent._replay).__name__}"
                )
            # Built after the checkpoint (if any) was restored: it stores into that buffer.
            spec = actor_row_spec(agent)
            ingest = agent._replay.chunk_ingest(
                np.zeros(spec[0][2], spec[0][1]), np.int32(0), peer_timeout=peer_timeout
            )
            self._receiver = ExperienceReceiver(ingest, sockets.pull)
            self.row_offsets: collections.Counter = collections.Counter()
            self._sockets = sockets
            self._publish_period = publish_period
            self._actors_alive = actors_alive
            self._limiter = None
            if samples_per_insert > 0:
                from memoire.rate_limiter import SampleToInsertRatio

                self._batch = int(agent._replay._batch_size)
                self._limiter = SampleToInsertRatio(
                    samples_per_insert,
                    agent.min_replay_history + 1,  # Dopamine trains past it
                    rate_error_buffer or 100 * self._batch,
                )
            self._publish()

        def _publish(self) -> None:
            self._sockets.publish(
                int(self._agent.training_steps), params_to_bytes(self._agent.online_params)
            )

        def _new_priority(self) -> float:
            """The priority the agent's ``_store_transition`` gives a new transition (Dopamine
            4.1.2's JAX agents: 1.0 for the 'uniform' scheme, else the largest recorded)."""
            if getattr(self._agent, "_replay_scheme", None) == "uniform":
                return 1.0
            return float(self._agent._replay.max_recorded_priority)

        def _train_one(self) -> None:
            self._agent._train_step()
            if self._agent.training_steps % self._publish_period == 0:
                self._publish()

        def _take_experience(self) -> list:
            """Episodes stored from actors (ExperienceReceiver.poll). With a rate limiter, none
            while it holds inserts back (actors wait on their sockets' high-water marks), and
            no wait while it lets the learner train."""
            lim = self._limiter
            if lim is None:
                return self._receiver.poll(timeout=0.5)
            if not lim.can_insert(1):
                return []
            stored = self._receiver.poll(timeout=0.0 if lim.can_sample(self._batch) else 0.5)
            lim.inserted(sum(rows for _, _, rows, _ in stored))
            return stored

        def _train_limited(self, most: int = 16) -> int:
            """With a rate limiter: up to `most` gradient updates (``update_period`` training
            steps each, one batch sampled) as far as it allows now. Returns training steps."""
            steps = 0
            for _ in range(most if self._limiter is not None else 0):
                if not self._limiter.await_sample(self._batch, 0.0, raise_on_timeout=False):
                    break
                for _ in range(self._agent.update_period):
                    self._train_one()
                    steps += 1
            return steps

        def _run_train_phase(self, statistics):
            self._phase = "train"
            agent = self._agent
            agent.eval_mode = False
            replay = agent._replay
            start = time.time()
            steps, returns = 0, []
            idle_since = time.time()
            while steps < self._training_steps:
                replay.set_ingest_priority(self._receiver.ingest, self._new_priority())
                stored = self._take_experience()
                self._sockets.acknowledge(stored)
                trained = self._train_limited()
                if not stored and not trained:
                    if not self._actors_alive():
                        raise NoActors(
                            "all actors have exited or disconnected (killed); see their lines above"
                        )
                    if time.time() - idle_since > NO_EXPERIENCE_S:
                        raise NoActors(
                            f"no experience from any actor for {NO_EXPERIENCE_S:g} s (actors "
                            f"reach the learner at {self._sockets.endpoints['experience']})"
                        )
                    continue
                idle_since = time.time()
                steps += trained
                for uuid, _, rows, info in stored:
                    if self._limiter is None:
                        for _ in range(rows):
                            self._train_one()
                        steps += rows
                    if info is None:
                        continue
                    ret, length, terminated = info
                    # rows stored minus the steps the actor took: one value for whole episodes
                    self.row_offsets[int(rows) - int(length)] += 1
                    self._episodes.record(
                        iteration=self._iteration,
                        phase="train",
                        episode_return=ret,
                        length=int(length),
                        terminated=bool(terminated),
                        actor=int(uuid) & 0xFFFFFFFF,
                    )
                    returns.append(ret)
                    statistics.append(
                        {"train_episode_lengths": int(length), "train_episode_returns": ret}
                    )
            average_return = float(np.mean(returns)) if returns else 0.0
            steps_per_second = steps / max(time.time() - start, 1e-9)
            statistics.append({"train_average_return": average_return})
            statistics.append({"train_average_steps_per_second": steps_per_second})
            return len(returns), average_return, steps_per_second

    return LearnerRunner


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


def run(facts: dict, config: DistributedConfig) -> int:
    """Starts ``config.num_actors`` actor processes and runs the learner here.

    Actors are stopped (stop notice and event, then join with a timeout, then terminate)
    however the learner ends. Returns 0 on success.
    """
    ctx = _actor_context()
    sockets = LearnerSockets(config)
    stop = ctx.Event()
    ends = ActorEndpoints(
        sockets.endpoints["experience"],
        sockets.endpoints["params"],
        config.queue_chunks,
        config.episodes_ahead,
        stop,
        config.keepalive,
    )
    actor_facts = {k: facts[k] for k in ("gin_files", "bindings", "seed")}
    procs = [
        ctx.Process(
            target=actor_main,
            name=f"memoire-actor-{i}",
            daemon=True,
            args=(i, actor_facts, config.as_dict(), ends),
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
        who = f"{config.num_actors} actor(s)" if procs else "actors started by endpoint"
        run_learner(facts, config, sockets, who, alive)
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


def experience_summary(
    counters: dict, row_offsets: dict, refused: Optional[int] = None, actors: str = ""
) -> str:
    """The learner's closing line: what its actors' experience came to, in labelled figures.

    Args:
      counters: the chunk ingest's counters (``chunks``, ``keepalives``, ``rejected`` by reason).
      row_offsets: {stored rows minus the actor's steps: episodes} (one value when every episode
        was stored whole; Dopamine's JAX buffer stores as many rows as steps).
      refused: connections refused for their CURVE keys (None: the sockets have no keys).
      actors: what the launcher says of its actors (e.g. ``Ray actors: 8 placed, 1 lost, 1
        restarted``), or ''.

    E.g. ``experience: 41 episodes stored (rows = actor steps in each); 226 chunks and 12
    keepalives received, 3 rejected (peer_lost 3); CURVE: 0 connections refused``.
    """
    episodes = sum(row_offsets.values())

    def rows(offset: int) -> str:
        if not offset:
            return "rows = actor steps"
        return f"rows = actor steps {'+' if offset > 0 else '-'} {abs(offset)}"

    if len(row_offsets) == 1:
        stored = f"{episodes} episodes stored ({rows(next(iter(row_offsets)))} in each)"
    elif row_offsets:
        parts = ", ".join(f"{n} with {rows(k)}" for k, n in sorted(row_offsets.items()))
        stored = f"{episodes} episodes stored ({parts})"
    else:
        stored = "0 episodes stored"
    rejected = dict(counters.get("rejected", {}))
    why = (
        " (" + ", ".join(f"{k} {v}" for k, v in sorted(rejected.items())) + ")" if rejected else ""
    )
    text = (
        f"experience: {stored}; {counters.get('chunks', 0)} chunks and "
        f"{counters.get('keepalives', 0)} keepalives received, "
        f"{sum(rejected.values())} rejected{why}"
    )
    if refused is not None:
        text += f"; CURVE: {refused} connection(s) refused"
    return text + (f"; {actors}" if actors else "")


def run_learner(
    facts: dict,
    config: DistributedConfig,
    sockets: LearnerSockets,
    who: str,
    actors_alive=lambda: True,
    actors_report=lambda: "",
) -> None:
    """Runs the learner on bound ``sockets`` until its last iteration (resuming from
    ``facts['dir']``'s checkpoints), in this process, with gin loaded. ``who`` names the actors
    in the log; ``actors_alive()`` False ends the run with an error; ``actors_report()`` is
    what the launcher says of its actors in the closing line (:func:`experience_summary`). The
    caller stops the actors and closes the sockets."""
    from memoire.experiments import replay_routing, runner

    learner = _learner_class()(
        facts["dir"],
        replay_routing.create_agent_fn(),
        sockets=sockets,
        publish_period=config.publish_period,
        actors_alive=actors_alive,
        seed=facts["seed"],
        samples_per_insert=config.samples_per_insert,
        rate_error_buffer=config.rate_error_buffer,
        peer_timeout=config.peer_timeout,
    )
    try:
        runner.write_operative_config(facts["dir"])
        if learner.start_iteration > 0:
            log.info("resuming %s at iteration %d", facts["dir"], learner.start_iteration)
        log.info(
            "learner with %s (experience %s, parameters %s)",
            who,
            sockets.endpoints["experience"],
            sockets.endpoints["params"],
        )
        learner.run_experiment()
        # What the actors' experience came to: stored, dropped by reason (peer_lost: actors
        # killed or frozen mid-episode), keepalives.
        log.info(
            "%s",
            experience_summary(
                learner._receiver.ingest.counters(),
                dict(learner.row_offsets),
                sockets.refused if sockets.encrypted else None,
                actors_report(),
            ),
        )
        runner.write_operative_config(facts["dir"])
    finally:
        learner.close()
