"""A distributed run as one SLURM job: ``memoire train --launcher slurm``.

Run on a login node, ``memoire train --launcher slurm ...`` (gin: ``DistributedConfig.launcher
= 'slurm'``) writes ``RUN_DIR/slurm/train.sbatch`` and submits it with ``sbatch`` (printing the
job id; ``SlurmConfig.submit = False`` only writes it). The job is one ``srun`` step of
``num_actors + 1`` tasks, each running the same ``memoire train`` command:

- **task 0 is the learner**. It binds its experience (PULL) and parameter (PUB) sockets on TCP
  with OS-chosen ports, on its node's address (``SlurmConfig.learner_host``: 'auto' is loopback
  when the job has one node, else the address its SLURM node name resolves to), and writes them
  to ``RUN_DIR/slurm/endpoints.json`` with the job's id;
- **task k (1..N) is actor k-1**. It waits (at most ``SlurmConfig.endpoint_wait_s`` seconds) for
  that file to name this job, then streams to the learner as ``memoire actor`` would. SLURM
  places task 0 on the first node of the job's node list; the file says which node it is.

``scancel`` (or the job's time limit) sends SIGTERM to every task: the learner stops at once,
closes its trackers, tells the actors to stop and exits 143; actors exit too. The run folder
then holds the checkpoint of the last iteration the learner finished, and re-submitting the job
(``sbatch RUN_DIR/slurm/train.sbatch``, or the same ``memoire train`` command) resumes from it,
as a killed local run does. What an interrupted iteration had done is lost, its stored
episodes with it. A node that fails (SLURM marks it down after its ``SlurmdTimeout``) makes
SLURM requeue the job (``JobRequeue=1``, its default): the same job id runs again once the
cluster has its nodes and resumes the same way (the endpoints file tells its runs apart by
``SLURM_RESTART_COUNT``); ``--no-requeue`` in ``SlurmConfig.options`` ends it instead (untested)
and submitting again resumes. When the lost node held every actor, the learner stops first,
with one line naming the job's other nodes (tests/system/test_slurm_hosts.py). An actor task that dies
on its own is not restarted: the learner goes on with the others and fails once all are gone
(see ``DistributedConfig.peer_timeout``).

Every node needs memoire installed at the same path as the submitting Python (or
``SlurmConfig.python``), and ``RUN_DIR`` on storage every node of the job sees. Experience and
parameters are encrypted and authenticated with CURVE keys made for the run when the learner
binds beyond loopback (a job of several nodes; ``SlurmConfig.curve``, ``--insecure`` turns them
off): ``memoire train`` makes them at submission and they reach the tasks in the job's
environment, never the run directory. On one node everything stays on loopback, in clear.
"""

from __future__ import annotations

import copy
import functools
import ipaddress
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Sequence

import gin

from memoire import cli, transport
from memoire.experiments import distributed, slurm

log = logging.getLogger(__name__)

SCRIPT_NAME = "train.sbatch"
ENDPOINTS_NAME = "endpoints.json"
TASK_ENV = "MEMOIRE_SLURM_TASK"  # set by the job script: this process is one of its tasks
EXIT_TERMINATED = 128 + signal.SIGTERM  # a task stopped by scancel (the shell's convention)
KEYS_ENV = "MEMOIRE_SLURM_RUN_KEYS"  # the run's CURVE keys, in the job's environment only
# A SIGTERM that Python dropped comes again this much later (s): long enough for the main
# thread to leave the gc callback or __del__ that dropped it.
REDELIVER_S = 0.05
ACTOR_START_S = 120.0
SCONTROL_S = 30.0  # seconds a question to the SLURM controller may take
# ... after SIGTERM, whose SIGKILL comes KillWait (30 s by default) later: less.
REQUEUE_ASK_S = 5.0  # an actor's start after it read the endpoints: imports, gin, environment


@gin.configurable(module="memoire.slurm")
class SlurmConfig:
    """How the SLURM launcher writes and submits the job (all gin-bindable).

    Args:
      cpus_per_task: CPUs of each task (the learner and each actor), ``--cpus-per-task``.
      time: the job's time limit in sbatch's form (``30``, ``4:00:00``, ``1-12:00:00``); ''
        for the partition's default.
      partition: the partition ('' for the cluster's default).
      options: further ``#SBATCH`` options, each ``--name=value`` (``--mem=8G``,
        ``--account=rl``, ``--nodes=2``).
      submit: False writes the script and submits nothing.
      learner_host: the address the learner binds on and actors connect to; 'auto': loopback
        when the job has one node, else the address the learner's SLURM node name resolves to.
      endpoint_wait_s: seconds an actor task waits for the learner's endpoints (the learner
        first loads its checkpoint, replay memory included).
      python: the interpreter the tasks run ('' for the one writing the script).
      curve: CURVE keys for the learner's sockets: 'auto' when they bind beyond loopback
        (a job of several nodes), 'on' always, 'off' never (``memoire train --insecure``).
        ``memoire train`` makes the keys when it submits the job and hands them to its tasks
        in the job's environment (``sbatch`` exports it); they are never written to the run
        directory, so a job script submitted again by hand (``sbatch train.sbatch``) runs only
        without keys.

    Raises:
      ValueError: on cpus_per_task below 1, a non-positive wait, a malformed time or option,
        an unknown ``curve``.
    """

    def __init__(
        self,
        cpus_per_task: int = 1,
        time: str = "",
        partition: str = "",
        options: Sequence[str] = (),
        submit: bool = True,
        learner_host: str = "auto",
        endpoint_wait_s: float = 600.0,
        python: str = "",
        curve: str = "auto",
    ):
        if int(cpus_per_task) < 1:
            raise ValueError(f"cpus_per_task must be >= 1, got {cpus_per_task}")
        if not (0 < float(endpoint_wait_s) < float("inf")):
            raise ValueError(f"endpoint_wait_s must be finite seconds > 0, got {endpoint_wait_s}")
        if isinstance(options, str):
            raise ValueError(f"options must be a list of --name=value strings, got {options!r}")
        if time and not slurm.TIME_FORMAT.match(time):
            raise ValueError(f"time must look like 30, 4:00:00 or 1-12:00:00, got {time!r}")
        for o in options:
            slurm.check_option(o)
        if not learner_host:
            raise ValueError("learner_host must be 'auto' or an address, got ''")
        if curve not in distributed.CURVE_SETTINGS:
            raise ValueError(f"curve must be one of {distributed.CURVE_SETTINGS}, got {curve!r}")
        self.cpus_per_task = int(cpus_per_task)
        self.time = time
        self.partition = partition
        self.options = tuple(options)
        self.submit = bool(submit)
        self.learner_host = learner_host
        self.endpoint_wait_s = float(endpoint_wait_s)
        self.python = python or sys.executable
        self.curve = curve


def in_task() -> bool:
    """Whether this process is a task of a job script this module wrote."""
    return os.environ.get(TASK_ENV) == "1" and "SLURM_PROCID" in os.environ


def task_rank() -> int:
    """This task's rank in the job's step (``SLURM_PROCID``): 0 is the learner, k the actor
    k-1."""
    return int(os.environ["SLURM_PROCID"])


def slurm_dir(run_dir: str) -> str:
    """``RUN_DIR/slurm``: the job script, SLURM's output of each job, the endpoints file."""
    return os.path.join(run_dir, "slurm")


def _job_key() -> dict:
    """Which job (and which run of it: a requeued job keeps its id) this process belongs to."""
    return {
        "job": os.environ.get("SLURM_JOB_ID", ""),
        "restart": os.environ.get("SLURM_RESTART_COUNT", "0"),
    }


# ---------------------------------------------------------------------------------------------
# The job script.


def train_argv(args, python: str) -> list:
    """The ``memoire train`` command every task runs: the submitted command's own arguments
    (``args``, as :mod:`memoire.commands.train` parsed them), paths made absolute."""
    argv = [python, "-m", "memoire.cli", "train", "--base_dir", os.path.abspath(args.base_dir)]
    argv += ["--index", str(args.index), "--launcher", "slurm"]
    if args.sweep:
        argv += ["--sweep", os.path.abspath(args.sweep)]
    for f in args.gin_files:
        argv += ["--gin_files", os.path.abspath(f)]
    for b in args.gin_bindings:
        argv += ["--gin_bindings", b]
    if getattr(args, "replay", None):
        argv += ["--replay", args.replay]
    if getattr(args, "verbose", False):
        argv.append("--verbose")
    return argv


def job_script(argv: Sequence[str], *, run_dir: str, num_actors: int, config: SlurmConfig) -> str:
    """The sbatch script: one srun step of ``num_actors + 1`` tasks running ``argv``, SLURM's
    output appended to ``run_dir/slurm/<job id>.out``."""
    run_dir = os.path.abspath(run_dir)
    lines = [
        "#!/bin/bash",
        "# Written by `memoire train --launcher slurm`: task 0 is the learner, tasks 1..N the",
        "# actors. Submit it again (sbatch this file) to resume from the last checkpoint.",
        "#SBATCH --job-name=memoire-train",
        f"#SBATCH --ntasks={num_actors + 1}",
        f"#SBATCH --cpus-per-task={config.cpus_per_task}",
        f"#SBATCH --chdir={os.getcwd()}",
        f"#SBATCH --output={slurm_dir(run_dir)}/%j.out",
        "#SBATCH --open-mode=append",
    ]
    if config.time:
        lines.append(f"#SBATCH --time={config.time}")
    if config.partition:
        lines.append(f"#SBATCH --partition={config.partition}")
    lines += [f"#SBATCH {o}" for o in config.options]
    lines += [
        f"export {TASK_ENV}=1",
        # One task per CPU set; a task whose rank exits early (an actor that failed) does not
        # end the others: the learner decides when the run is over.
        f"exec srun --ntasks={num_actors + 1} --cpus-per-task={config.cpus_per_task} "
        "--kill-on-bad-exit=0 " + " ".join(shlex.quote(a) for a in argv),
        "",
    ]
    return "\n".join(lines)


def submit_run(args, facts: dict, config: distributed.DistributedConfig) -> int:
    """Writes the job script of the run in ``facts['dir']`` and submits it (unless
    ``SlurmConfig.submit`` is False). Prints the script's path, then ``JOB <id>``."""
    slurm_config = SlurmConfig()
    folder = slurm_dir(facts["dir"])
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, SCRIPT_NAME)
    text = job_script(
        train_argv(args, slurm_config.python),
        run_dir=facts["dir"],
        num_actors=config.num_actors,
        config=slurm_config,
    )
    with open(path, "w") as f:
        f.write(text)
    cli.emit(path)
    if slurm_config.submit:
        env = None
        if slurm_config.curve != "off":
            env = dict(os.environ, **{KEYS_ENV: _encode_keys(*transport.run_keys())})
        try:
            job = slurm.submit(path, env=env)
        except RuntimeError as e:
            raise cli.UsageError(e) from None
        log.info("submitted job %s: learner and %d actor task(s)", job, config.num_actors)
        cli.emit(f"JOB {job}")
    return 0


# ---------------------------------------------------------------------------------------------
# The tasks.


def _encode_keys(server: transport.CurveKeys, client: transport.CurveKeys) -> str:
    """The run's keys (:func:`memoire.transport.run_keys`) as one environment value."""
    return json.dumps(
        {
            "server_public": server.public.decode(),
            "server_secret": server.secret.decode(),
            "client_public": client.public.decode(),
            "client_secret": client.secret.decode(),
        }
    )


def run_keys_from_env() -> tuple:
    """The run's ``(server side, client side)`` CURVE keys that ``memoire train`` put in the
    job's environment.

    Raises:
      ValueError: when the environment has none (a job script submitted by hand) or they are
        malformed, saying how to go on.
    """
    text = os.environ.get(KEYS_ENV)
    if not text:
        raise ValueError(
            "this job's learner binds beyond loopback but its environment has no CURVE keys "
            f"({KEYS_ENV}): submit it with `memoire train --launcher slurm ...`, which makes "
            "them, or run without keys (--insecure, SlurmConfig.curve = 'off')"
        )
    try:
        k = {name: v.encode() for name, v in json.loads(text).items()}
        server = transport.CurveKeys(
            public=k["server_public"], secret=k["server_secret"], authorized=(k["client_public"],)
        )
        client = transport.CurveKeys(
            public=k["client_public"], secret=k["client_secret"], server_public=k["server_public"]
        )
    except (ValueError, KeyError, AttributeError, TypeError):
        raise ValueError(f"{KEYS_ENV}: malformed CURVE keys in the job's environment") from None
    return server, client


def learner_host(configured: str = "auto") -> str:
    """The address the learner binds on (see :class:`SlurmConfig`).

    On a job of several nodes, 'auto' is the address SLURM itself reaches the learner's node
    at (its ``NodeAddr``, from ``scontrol show node``; a cluster whose slurm.conf names nodes
    that no resolver knows has only that), else what the node's name resolves to.

    Raises:
      ValueError: when the job has several nodes and that address is a loopback one (Debian's
        ``127.0.1.1 hostname`` line) or the name resolves to nothing: actors on other nodes
        could not reach it; ``SlurmConfig.learner_host`` must name the interface.
    """
    if configured != "auto":
        return configured
    if os.environ.get("SLURM_JOB_NUM_NODES", "1") == "1":
        return "127.0.0.1"  # every task is on this node: nothing leaves it
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    address = _node_addr(node)
    if address is None:
        try:
            address = socket.gethostbyname(node)
        except OSError as e:
            raise ValueError(
                f"this job has several nodes but the learner's node {node!r} has no address "
                f"that SLURM or the resolver knows ({e}): bind SlurmConfig.learner_host to "
                "this node's cluster address"
            ) from None
    if address.startswith("127."):
        raise ValueError(
            f"this job has several nodes but the learner's node {node!r} resolves to "
            f"{address}, which actors on other nodes cannot reach: bind "
            "SlurmConfig.learner_host to this node's cluster address"
        )
    return address


def _scontrol_fields(kind: str, name: str, timeout: float):
    """``scontrol -o show KIND NAME``'s ``Key=Value`` fields as a dict (None where scontrol is
    missing, fails to start or takes more than ``timeout`` seconds)."""
    try:
        out = subprocess.run(
            ["scontrol", "-o", "show", kind, name],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return dict(w.split("=", 1) for w in out.split() if "=" in w)


def _node_addr(node: str):
    """`node`'s ``NodeAddr`` as the controller knows it, if it is an IP address (None where
    scontrol is missing, fails, or names a host, which the resolver then looks up)."""
    fields = _scontrol_fields("node", node, SCONTROL_S)
    if fields is None:
        return None
    try:
        return str(ipaddress.ip_address(fields.get("NodeAddr", "")))
    except ValueError:
        return None


def write_endpoints(run_dir: str, endpoints: dict) -> str:
    """Writes the learner's endpoints and this job's key to ``RUN_DIR/slurm/endpoints.json``
    (atomically: actors never read half a file). Returns its path."""
    path = os.path.join(slurm_dir(run_dir), ENDPOINTS_NAME)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record = dict(
        _job_key(), node=os.environ.get("SLURMD_NODENAME", socket.gethostname()), **endpoints
    )
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)
    return path


def read_endpoints(run_dir: str, timeout: float, poll: float = 0.2) -> dict:
    """Waits at most ``timeout`` seconds for the endpoints file to name this process's job and
    returns ``{'experience': ..., 'params': ..., 'encrypted': whether the learner uses the
    run's CURVE keys}``. A file left by an earlier job (a job
    submitted again resumes in the same folder) is ignored.

    Raises:
      TimeoutError: naming the file, when no learner of this job wrote it in time.
    """
    path = os.path.join(slurm_dir(run_dir), ENDPOINTS_NAME)
    key = _job_key()
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                record = json.load(f)
            if {k: record.get(k) for k in key} == key:
                return {
                    "experience": record["experience"],
                    "params": record["params"],
                    "encrypted": bool(record.get("encrypted", False)),
                }
        except (OSError, ValueError, KeyError, AttributeError):
            pass  # not written yet, or an unreadable leftover: the learner replaces it
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"no endpoints from the learner of job {key['job']} in {path} after "
                f"{timeout:g} s (SlurmConfig.endpoint_wait_s); see the learner's output"
            )
        time.sleep(poll)


class Terminated(BaseException):
    """SIGTERM arrived (``scancel``, the job's time limit): the task stops. A BaseException,
    as KeyboardInterrupt, so that no ``except Exception`` on the way swallows it."""


def _on_sigterm(signum, frame):
    # Once: a second SIGTERM must not cut the cleanup short (SLURM's SIGKILL comes KillWait
    # seconds after the first).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


def _redeliver_swallowed_sigterm(previous, unraisable) -> None:
    # Python runs a signal handler wherever the main thread is, and where that is a gc
    # callback (JAX registers one) or a __del__, it prints the handler's exception and drops
    # it: the task would run on as if SIGTERM never came, until SLURM's SIGKILL. So send it
    # again, a moment later, when the main thread is back in ordinary code.
    if not isinstance(unraisable.exc_value, Terminated):
        previous(unraisable)
        return
    log.debug(
        "SIGTERM's exception raised where Python drops it (%s); sending it again", unraisable.object
    )
    signal.signal(signal.SIGTERM, _on_sigterm)
    main = threading.main_thread().ident
    again = threading.Timer(REDELIVER_S, signal.pthread_kill, (main, signal.SIGTERM))
    again.daemon = True
    again.start()


def catch_sigterm() -> None:
    """From now on the first SIGTERM raises :class:`Terminated` in the main thread, whatever
    it is running then; later ones are ignored, so that cleanup runs to its end."""
    signal.signal(signal.SIGTERM, _on_sigterm)  # Python's default would skip every `finally`
    if getattr(sys.unraisablehook, "func", None) is not _redeliver_swallowed_sigterm:
        sys.unraisablehook = functools.partial(_redeliver_swallowed_sigterm, sys.unraisablehook)


def run_task(facts: dict, config: distributed.DistributedConfig) -> int:
    """Runs this task's role in the job (see the module): the learner (rank 0) or an actor.

    Returns the exit code: 0, :data:`EXIT_TERMINATED` when SIGTERM stopped it, 1 when an
    actor found no learner.
    """
    slurm_config = SlurmConfig()
    config = copy.copy(config)
    config.transport = "zmq"  # actors may be on other nodes: TCP, not ipc://
    config.spawn_actors = False
    rank = task_rank()
    catch_sigterm()
    try:
        if rank == 0:
            _run_learner(facts, config, slurm_config)
        else:
            _run_actor(rank - 1, facts, config, slurm_config)
    except Terminated:
        task = f"task {rank} ({'learner' if rank == 0 else f'actor {rank - 1}'})"
        if requeued():
            # A node of the job failed (its machine, or the network to it): SLURM stops the
            # tasks left and runs the job again by itself; nothing to submit.
            job = os.environ.get("SLURM_JOB_ID", "?")
            log.warning(
                "%s stopped by SIGTERM: SLURM requeued job %s (a node failed); it resumes from "
                "the last checkpoint in %s by itself once its nodes are up",
                task,
                job,
                facts["dir"],
            )
        else:
            log.warning(
                "%s stopped by SIGTERM; submit the job again to resume from the last "
                "checkpoint in %s",
                task,
                facts["dir"],
            )
        return EXIT_TERMINATED
    except TimeoutError as e:
        log.error("%s", e)
        return 1
    return 0


def _run_learner(facts: dict, config, slurm_config: SlurmConfig) -> None:
    host = learner_host(slurm_config.learner_host)
    keys = run_keys_from_env()[0] if distributed.use_curve(slurm_config.curve, host) else None
    sockets = distributed.LearnerSockets(config, host=host, keys=keys)
    warning = distributed.insecure_warning(slurm_config.curve, sockets.endpoints["experience"])
    if warning:
        log.warning("%s", warning)
    started = time.monotonic()

    def actors_alive() -> bool:
        # Actor tasks that never connect (they failed before, or found no endpoints) end the
        # run once they could no longer be on their way; connected ones, once all are gone.
        if not sockets.actors_seen():
            return time.monotonic() - started < slurm_config.endpoint_wait_s + ACTOR_START_S
        return not sockets.actors_gone(config.peer_timeout)

    try:
        path = write_endpoints(facts["dir"], dict(sockets.endpoints, encrypted=sockets.encrypted))
        log.info("learner endpoints in %s: %s", path, sockets.endpoints)
        distributed.run_learner(
            facts, config, sockets, f"{config.num_actors} SLURM actor task(s)", actors_alive
        )
    except distributed.NoActors as e:
        if not sockets.actors_gone(config.peer_timeout):
            raise
        # On SLURM, actors that all went at once are most often a lost node: say which nodes
        # they were on and what SLURM does next, in the one line the learner ends with.
        raise distributed.NoActors(_actors_lost(config.num_actors)) from e
    finally:
        sockets.stop_actors()
        time.sleep(0.2)  # let the stop notice leave before the socket closes
        sockets.close()


def job_nodes() -> list:
    """The names of this job's nodes (``scontrol show hostnames $SLURM_JOB_NODELIST``; the
    list as SLURM wrote it where scontrol fails)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=SCONTROL_S,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    return out or [nodelist]


def requeued() -> bool:
    """Whether SLURM has requeued this task's job since this run of it started: the
    controller counts more restarts than ``SLURM_RESTART_COUNT`` (False where it cannot be
    asked)."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return False
    fields = _scontrol_fields("job", job, REQUEUE_ASK_S)
    if fields is None:
        return False
    try:
        return int(fields["Restarts"]) > int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    except (KeyError, ValueError):
        return False


def _actors_lost(num_actors: int) -> str:
    """What the learner says when every actor task's connection closed (see _run_learner)."""
    here = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    others = [n for n in job_nodes() if n != here]
    job = os.environ.get("SLURM_JOB_ID", "?")
    if not others:  # every task ran on this node, which is up: the tasks themselves went
        return (
            f"all {num_actors} SLURM actor task(s) disconnected: killed or failed on this "
            f"node ({here}); see their lines above"
        )
    return (
        f"all {num_actors} SLURM actor task(s) disconnected: their node(s) "
        f"{','.join(others)} lost, or the tasks killed; SLURM requeues job {job} when a node "
        f"fails and it resumes from the last checkpoint once its nodes are up (scancel {job} "
        "to stop it instead)"
    )


def _run_actor(actor_id: int, facts: dict, config, slurm_config: SlurmConfig) -> None:
    ends = read_endpoints(facts["dir"], slurm_config.endpoint_wait_s)
    gin.clear_config()  # actor_main loads the same gin files again, into an unlocked config
    actor_facts = {k: facts[k] for k in ("gin_files", "bindings", "seed")}
    distributed.actor_main(
        actor_id,
        actor_facts,
        config.as_dict(),
        distributed.ActorEndpoints(
            ends["experience"],
            ends["params"],
            config.queue_chunks,
            config.episodes_ahead,
            keepalive=config.keepalive,
            keys=run_keys_from_env()[1] if ends["encrypted"] else None,
        ),
    )
