"""The peers of the link tests, each a process on a test host (tests/helpers/_netns.py): a server, an
actor, a learner, a distributed learner and its actor, a plain peer.

    python tests/helpers/_link_peers.py ROLE JSON-ARGS

Each prints JSON lines on stdout: ``{"ready": {...}}`` once it serves or is connected,
``{"status": {...}}`` every STATUS_S seconds, and ``{"done": {...}}`` at its end; it ends
when its stdin says ``stop`` or closes (or, for a learner given a count, after that many
batches). What a test checks is in those lines; a peer that finds something wrong raises
(a traceback on stderr, a non-zero exit).

Memories hold Atari-like entries (uint8[84, 84] frames, stack 4) of episodes of EPISODE
entries, filled by :func:`fill` (the same contents for the same seed, so a learner can build
the server's memory for itself and compare batches bit for bit).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

import numpy as np
from _batches import assert_same_batch

FRAME = (84, 84)
STACK = 4
EPISODE = 100
STATUS_S = 0.2


def say(kind: str, value: dict) -> None:
    print(json.dumps({kind: value}), flush=True)


def rss_mib() -> float:
    """This process's resident memory, MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * 4096 / 2**20


def templates():
    """The memory's field templates: Atari-like uint8 frames and memoire's usual scalars."""
    from memoire.bench.ingest import templates as ingest_templates

    return ingest_templates(FRAME, np.uint8)


def frames(rng, steps: int, compressible: bool) -> np.ndarray:
    """uint8[steps, 84, 84]: random (nothing compresses), or flat screens with a few random
    bands (as Atari screens: a tenth of their bytes in LZ4)."""
    if not compressible:
        return rng.integers(0, 255, (steps,) + FRAME, dtype=np.uint8)
    out = np.zeros((steps,) + FRAME, np.uint8)
    out[:] = rng.integers(0, 4, (steps, 1, 1), dtype=np.uint8) * 40
    rows = rng.integers(0, FRAME[0] - 6, steps)
    for k in range(steps):
        out[k, rows[k] : rows[k] + 6] = rng.integers(0, 255, (6, FRAME[1]), dtype=np.uint8)
    return out


def episode(rng, steps: int, compressible: bool) -> tuple:
    """s, a, r, p, v, i, init_w of one episode."""
    return (
        frames(rng, steps, compressible),
        rng.integers(0, 6, steps),
        rng.normal(size=steps).astype(np.float32),
        rng.random(steps).astype(np.float32),
        rng.normal(size=steps).astype(np.float32),
        np.zeros((steps, 0), np.uint8),
        (rng.random(steps) + 0.1).astype(np.float32),
    )


def fill(rem, entries: int, seed: int, compressible: bool) -> None:
    """`entries` entries in episodes of EPISODE into any memory, the same for the same seed."""
    rem.frame_stack = STACK
    rem.priority_exponent = 0.6
    rng = np.random.default_rng(seed)
    for start in range(0, entries, EPISODE):
        rem.new_episode()
        rem.add_entries(*episode(rng, min(EPISODE, entries - start), compressible))
        rem.close_episode(terminal=bool(start % 2))


def keys(args: dict, side: str):
    """CurveKeys from the files in ``args['keys']`` (server.key_secret, authorized/, client
    keypair), or None."""
    from memoire.transport import CurveKeys

    folder = args.get("keys")
    if not folder:
        return None
    if side == "server":
        return CurveKeys(
            secret_file=f"{folder}/server.key_secret", authorized_dir=f"{folder}/authorized"
        )
    return CurveKeys(
        secret_file=f"{folder}/client.key_secret", server_public_file=f"{folder}/server.key"
    )


class Control:
    """Stdin: ``stop`` sets :attr:`stop`; ``hold`` clears :attr:`go`, ``go`` sets it; its end
    sets :attr:`stop` and :attr:`end` (and :attr:`go`)."""

    def __init__(self):
        self.stop = threading.Event()
        self.end = threading.Event()
        self.go = threading.Event()
        self.go.set()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            word = line.strip()
            if word == "stop":
                self.stop.set()
            elif word == "hold":
                self.go.clear()
            elif word == "go":
                self.go.set()
        self.stop.set()
        self.go.set()
        self.end.set()


# ---------------------------------------------------------------------------------------------


def server(args: dict) -> None:
    """A central-mode server bound on ``args['bind']`` (REP, PULL, a sampling stream),
    filled with ``args['fill']`` entries; status: its stats and RSS."""
    from memoire.server import ReplayMemoryServer

    control = Control()
    srv = ReplayMemoryServer(
        *templates(),
        int(args["capacity"]),
        pub_endpoint=None,
        keys=keys(args, "server"),
        seed=int(args["seed"]),
        peer_timeout=float(args.get("peer_timeout", 10.0)),
        compress_states=bool(args.get("compress", False)),
    )
    try:
        fill(srv.rem, int(args["fill"]), int(args["seed"]), bool(args.get("compress", False)))
        bind = f"tcp://{args['bind']}:*"
        eps = srv.start(bind, bind)
        eps["stream"] = srv.start_stream(bind, threads=int(args.get("threads", 1)))
        say("ready", eps)
        most = rss_mib()
        while not control.stop.wait(STATUS_S):
            most = max(most, rss_mib())
            say("status", dict(srv.stats(), rss_mib=rss_mib(), rss_max_mib=most))
        say("done", dict(srv.stats(), rss_mib=rss_mib(), rss_max_mib=most))
    finally:
        srv.close()


def actor(args: dict) -> None:
    """A central-mode ReplayMemoryClient streaming episodes of EPISODE entries, one entry every
    ``args['step_s']`` seconds (``args['timeout']``: how long a push may wait). On ``hold`` it
    stops in the middle of its next episode (once a chunk of it went; keepalives go on) until
    ``go``. On ``stop`` it finishes its episode, says done, and keeps its socket (what it
    queued still goes) until its stdin ends. Status: episodes closed and abandoned (a push
    that timed out), rows sent, whether it is held (and its episode), the longest wait of
    one entry (s), its largest RSS (MiB)."""
    from memoire.client import ReplayMemoryClient

    control = Control()
    chunk = int(args.get("chunk", 20))
    client = ReplayMemoryClient(
        None,
        args["rep"],
        args["pull"],
        mode="central",
        keys=keys(args, "client"),
        timeout=float(args.get("timeout", 5.0)),
        keepalive=float(args.get("keepalive", 1.0)),
        chunk_size=chunk,
    )
    rng = np.random.default_rng(1)
    s, a, r, p, v, i, w = episode(rng, EPISODE, compressible=False)
    count = dict(closed=0, abandoned=0, rows=0, held=None, longest_wait_s=0.0, rss_mib=rss_mib())
    say("ready", {"uuid": client.uuid})
    step_s = float(args.get("step_s", 0.0))
    try:
        while not control.stop.is_set():
            client.new_episode()
            try:
                for k in range(EPISODE):
                    if k == chunk + 1 and not control.go.is_set():  # a chunk of it went
                        count["held"] = client._pusher.stream.episode
                        say("status", count)
                        control.go.wait()
                        count["held"] = None
                    t0 = time.monotonic()
                    client.add_entry(s[k], a[k], r[k], p[k], v[k], i[k], w[k])
                    count["longest_wait_s"] = max(count["longest_wait_s"], time.monotonic() - t0)
                    count["rows"] += 1
                    if step_s:
                        time.sleep(step_s)
                client.close_episode()
                count["closed"] += 1
            except TimeoutError:
                count["abandoned"] += 1
            count["rss_mib"] = max(count["rss_mib"], rss_mib())
            say("status", count)
        say("done", count)
        control.end.wait(120)
    finally:
        client.close()


def learner(args: dict) -> None:
    """A SamplingStream learner. With ``args['compare']``, builds the server's memory for
    itself (same fill and seed) and checks every batch bit for bit against its get_batch,
    ending after ``args['batches']``; else takes batches until stopped, counting timeouts
    (``args['timeout']`` seconds each: the learner then simply asks again)."""
    from memoire import ReplayMemory
    from memoire.stream import SamplingStream

    control = Control()
    local = None
    if args.get("compare"):
        local = ReplayMemory(*templates(), int(args["capacity"]))
        local.seed(int(args["seed"]))
        fill(local, int(args["fill"]), int(args["seed"]), bool(args.get("compress", False)))
    count = dict(batches=0, timeouts=0, equal=0)
    with SamplingStream(
        args["stream"],
        int(args.get("batch", 32)),
        keys=keys(args, "client"),
        timeout=float(args.get("timeout", 30.0)),
        connections=int(args.get("connections", 1)),
        depth=max(4, int(args.get("connections", 1))),
    ) as stream:
        say(
            "ready",
            {"shared_memory": stream.shared_memory, "compressed_rows": stream.compressed_rows},
        )
        last = time.monotonic()
        while not control.stop.is_set():
            if args.get("batches") and count["batches"] >= int(args["batches"]):
                break
            try:
                batch = next(stream)
                count["batches"] += 1
                if local is not None:
                    assert_same_batch(batch, local.get_batch(int(args.get("batch", 32))))
                    count["equal"] += 1
            except TimeoutError:
                count["timeouts"] += 1
            if time.monotonic() - last >= STATUS_S:
                say("status", dict(count, last_seq=stream._source.last_seq))
                last = time.monotonic()
        say("done", dict(count, last_seq=stream._source.last_seq))


# ---- a distributed learner, its actor, a stranger, a capture


MARKER = b"memoire-link-test-marker:0123456789abcdef"  # what the actor's frames are made of


def dist_learner(args: dict) -> None:
    """A distributed learner's sockets bound on ``args['host']`` as the launchers bind them:
    CURVE keys of the run when ``distributed.use_curve(args['curve'], host)`` (keys from the
    job's environment, as the SLURM launcher hands them). Counts the chunks that arrive,
    anything else that arrives (``strangers``), and the connections refused for their keys;
    publishes parameters (a few bytes) as it goes."""
    import zmq

    from memoire.experiments import distributed, slurm_launcher

    control = Control()
    host = args["host"]
    config = distributed.DistributedConfig(num_actors=1, transport="zmq")
    use = distributed.use_curve(args["curve"], host)
    sockets = distributed.LearnerSockets(
        config, host=host, keys=slurm_launcher.run_keys_from_env()[0] if use else None
    )
    count = dict(chunks=0, strangers=0, refused=0, encrypted=sockets.encrypted)
    try:
        say("ready", dict(sockets.endpoints, encrypted=sockets.encrypted))
        while not control.stop.is_set():
            if sockets.pull.poll(100):
                try:
                    frames = sockets.pull.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:  # a wake-up without a message (a refused handshake's)
                    continue
                if MARKER[:8] in frames[0] or len(frames) < 2:
                    count["strangers"] += 1
                else:
                    count["chunks"] += 1
            sockets.publish(count["chunks"], b"parameters")  # what a SUB would get
            sockets.watch()
            count["refused"] = sockets.refused
            say("status", count)
        say("done", count)
    finally:
        sockets.close()


def dist_actor(args: dict) -> None:
    """A distributed actor's link to ``args`` (the learner's endpoints, ``encrypted``: with the
    run's client keys from the job's environment), streaming chunks of MARKER frames and
    counting the parameters it receives."""
    from memoire.experience import ChunkStream
    from memoire.experiments import distributed, slurm_launcher

    control = Control()
    keys = slurm_launcher.run_keys_from_env()[1] if args["encrypted"] else None
    link = distributed.ActorEndpoints(args["experience"], args["params"], keys=keys).open(0)
    spec = [
        ("observation", np.uint8, FRAME),
        ("action", np.int32, ()),
        ("reward", np.float64, ()),
        ("terminal", np.bool_, ()),
    ]
    stream = ChunkStream(spec, link.send, chunk_rows=4, uuid=link.uuid)
    size = FRAME[0] * FRAME[1]
    frame = np.frombuffer((MARKER * (size // len(MARKER) + 1))[:size], np.uint8).reshape(FRAME)
    row = {"observation": frame, "action": 0, "reward": 0.0, "terminal": False}
    rows = parameters = 0
    try:
        say("ready", {})
        while not control.stop.is_set():
            stream.add(row)
            rows += 1
            parameters += link.latest() is not None
            if rows % 16 == 0:
                stream.end_episode(True)
                say("status", {"rows": rows, "parameters": parameters})
            time.sleep(0.005)
        say("done", {"rows": rows, "parameters": parameters})
    finally:
        stream.close()
        link.close()


def plain(args: dict) -> None:
    """A peer without keys: a PUSH to ``args['experience']`` and a SUB to ``args['params']``,
    trying to send and receive until stopped."""
    import zmq

    control = Control()
    ctx = zmq.Context()
    push, sub = ctx.socket(zmq.PUSH), ctx.socket(zmq.SUB)
    for sock in (push, sub):
        sock.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    push.connect(args["experience"])
    sub.connect(args["params"])
    count = dict(queued=0, received=0)
    say("ready", {})
    while not control.stop.is_set():
        try:
            push.send(MARKER[:8] + b" from a stranger", zmq.NOBLOCK)
            count["queued"] += 1
        except zmq.Again:
            pass
        if sub.poll(100):
            sub.recv_multipart()
            count["received"] += 1
    say("done", count)
    push.close(0)
    sub.close(0)
    ctx.term()


def sniff(args: dict) -> None:
    """Captures every frame on ``args['device']`` (this host's end of a link) until stopped;
    says whether MARKER ever crossed in clear. Needs root (a packet socket)."""
    import socket

    control = Control()
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))  # ETH_P_ALL
    sock.bind((args["device"], 0))
    sock.settimeout(0.1)
    count = dict(frames=0, bytes=0, marker=False)
    say("ready", {})
    while not control.stop.is_set():
        try:
            data = sock.recv(1 << 18)
        except socket.timeout:
            continue
        count["frames"] += 1
        count["bytes"] += len(data)
        count["marker"] = count["marker"] or MARKER in data
    sock.close()
    say("done", count)


def ray_probe(args: dict) -> None:
    """A driver of the Ray cluster at ``args['address']`` that reports, every STATUS_S, the
    nodes alive (by address) and where the run ``args['run']``'s learner and actors are (their
    node's address, pid, chunks sent). Every call is bounded (10 s)."""
    import ray

    from memoire.experiments import ray_launcher

    control = Control()
    ray.init(address=args["address"], namespace=ray_launcher.NAMESPACE, log_to_driver=False)

    def call(handle, method):
        try:
            return ray.get(getattr(handle, method).remote(), timeout=10)
        except (ray.exceptions.RayError, ValueError):
            return None

    def named(name):
        try:
            return ray.get_actor(name, namespace=ray_launcher.NAMESPACE)
        except ValueError:
            return None

    say("ready", {})
    while not control.stop.wait(STATUS_S):
        nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        status = {"nodes": sorted(nodes.values())}
        learner = named(ray_launcher.learner_name(args["run"]))
        if learner is not None:
            status["learner"] = nodes.get(call(learner, "node"))
        actors = []
        for i in range(int(args["actors"])):
            actor = named(ray_launcher.actor_name(args["run"], i))
            if actor is not None:
                actors.append(
                    {
                        "node": nodes.get(call(actor, "node")),
                        "pid": call(actor, "pid"),
                        "chunks": call(actor, "chunks_sent"),
                    }
                )
        status["actors"] = actors
        say("status", status)
    say("done", {})
    ray.shutdown()


ROLES = {
    "server": server,
    "actor": actor,
    "learner": learner,
    "dist_learner": dist_learner,
    "dist_actor": dist_actor,
    "plain": plain,
    "sniff": sniff,
    "ray_probe": ray_probe,
}


# ---------------------------------------------------------------------------------------------
# The test's side.


class Peer:
    """A peer started on a test host (``TestHosts.popen``), its JSON lines read by a thread:
    :attr:`ready`, the latest :attr:`status`, :attr:`done`, and every line of stderr kept
    (:attr:`log`)."""

    def __init__(self, hosts, host: str, role: str, args: dict, env: dict):
        import subprocess

        self.role = role
        self.ready = self.done = None
        self.status: dict = {}
        self.log: list = []
        # The script imports the tests' helpers (_batches): their folder goes on its path.
        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")])))
        self.proc = hosts.popen(
            host,
            [sys.executable, __file__, role, json.dumps(args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._threads = [
            threading.Thread(target=self._out, daemon=True),
            threading.Thread(target=self._err, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _out(self) -> None:
        for line in self.proc.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            for kind, value in record.items():
                if kind == "status":
                    self.status = value
                else:
                    setattr(self, kind, value)

    def _err(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))

    def failed(self) -> bool:
        """The process ended without saying it was done."""
        return self.proc.poll() is not None and self.done is None

    def stop(self, timeout: float = 30.0) -> dict:
        """Says stop and waits (at most `timeout` s) for its end; returns its last words."""
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        self.proc.wait(timeout)
        for t in self._threads:
            t.join(timeout)
        return self.done

    def stderr(self) -> str:
        return "\n".join(self.log[-60:])


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    ROLES[sys.argv[1]](json.loads(sys.argv[2]))
