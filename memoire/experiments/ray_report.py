"""What Ray did with a run's processes, told as memoire's lines: where the learner and the actors
were placed, which wait and why, which were lost and restarted; and Ray's own output kept to
``--log-level debug``, as other packages' chatter is (:func:`memoire.cli.quiet_third_party`).

Read from Ray's control store (GCS) by the driver: the nodes' resources (``ray.nodes()``,
what is free on each) and the actor table (each actor's state, process id, restarts and cause
of death). Nothing here starts, places or stops a process (:mod:`.ray_launcher` does).

Placement is judged by resources, as Ray's scheduler judges it: a process is *placed* once a
node has given it a worker process (its pid is known); it is *pending* while no node has what it
asks for free; and it can *never* be placed when no node of the cluster has that much in all
(a custom resource no node was started with, more CPUs than any node has).
"""

from __future__ import annotations

import functools
import logging
import re
import sys
from typing import Callable, Dict, List, Optional

from memoire import cli

log = logging.getLogger("memoire.experiments.ray_launcher")

# Ray's own log lines in its processes' output: C++ (``[2026-01-01 10:00:00,123 W 12 34]
# core_worker.cc:...``) and Python (``2026-01-01 10:00:00,123\tINFO worker.py:1 -- ...``), at a
# level below ERROR. At every level but debug they are left out (ERROR and FATAL pass).
_RAY_LINE = re.compile(
    r"^(\x1b\[[0-9;]*m)*(\[\d{4}-\d\d-\d\d [\d:,.]+ [DIW] \d+ \d+\]"
    r"|\d{4}-\d\d-\d\d [\d:,.]+\s+(DEBUG|INFO|WARNING) \S+\.py:\d+ -- )"
)
_RAY_SOURCES = ("autoscaler", "raylet")  # lines of Ray's daemons, not of a worker


def quiet() -> bool:
    """Whether Ray's own output is kept out (every log level but debug)."""
    return cli.third_party_quiet()


def forward_worker_output() -> None:
    """Replaces Ray's printer of the cluster's output on this driver (it prefixes each line
    with ``(ActorName pid=N)``, prints the autoscaler's and the raylets' notices, and sends a
    worker's stdout to this process's stdout) by memoire's: the learner's and the actors'
    lines go to stderr as they wrote them, the way a local run prints them, and Ray's own
    (its daemons' notices, its log lines in workers) only with ``--log-level debug``, where
    Ray's printer stays. Call after ``ray.init(log_to_driver=True)``."""
    if not quiet():
        return
    from ray._private import worker

    dispatcher = worker.global_worker_stdstream_dispatcher
    dispatcher.remove_handler("ray_print_logs")
    dispatcher.add_handler("ray_print_logs", functools.partial(_print, sys.stderr))
    # The driver's listener of the cluster's error notices ("Task ActorProcess.join failed.
    # There are infinite retries remaining, ...", as from the raylet) prints through this one.
    worker.print_to_stdstream = lambda data, ignore_prefix=False: _print(sys.stderr, data)


def is_ray_line(line: str) -> bool:
    """Whether ``line`` is one of Ray's own log lines below ERROR."""
    return bool(_RAY_LINE.match(line))


def _print(sink, data: dict) -> None:
    if data.get("pid") in _RAY_SOURCES:
        return
    lines = [line for line in data.get("lines", ()) if line and not is_ray_line(line)]
    if lines:
        sink.write("".join(f"{line}\n" for line in lines))
        sink.flush()


# ---------------------------------------------------------------------------------------------
# Resources.


def resources_text(resources: Dict[str, float]) -> str:
    """``{'CPU': 1.0, 'learner': 1.0}`` as ``1 CPU, 1 learner`` (zero amounts left out)."""
    parts = [f"{v:g} {k}" for k, v in sorted(resources.items()) if v]
    return ", ".join(parts) or "nothing"


def demand(cpus: float, gpus: float = 0.0, custom: Optional[Dict[str, float]] = None) -> dict:
    """The resources a Ray actor asks for (what ``num_cpus``, ``num_gpus`` and ``resources``
    reserve), zero amounts left out."""
    out = {
        "CPU": float(cpus),
        "GPU": float(gpus),
        **{k: float(v) for k, v in (custom or {}).items()},
    }
    return {k: v for k, v in out.items() if v}


def fits(want: dict, have: Dict[str, float]) -> bool:
    """Whether resources ``have`` hold ``want``."""
    return all(have.get(k, 0.0) + 1e-9 >= v for k, v in want.items())


def alive_nodes() -> List[dict]:
    """The cluster's live nodes: ``{'id', 'ip', 'total', 'free'}`` (resources by name)."""
    import ray
    from ray._private import state

    free = state.available_resources_per_node()
    return [
        {
            "id": n["NodeID"],
            "ip": n.get("NodeManagerAddress", "?"),
            "total": dict(n.get("Resources", {})),
            "free": dict(free.get(n["NodeID"], {})),
        }
        for n in ray.nodes()
        if n.get("Alive")
    ]


def queued(want: dict) -> int:
    """How many of the cluster's tasks and actors asking for exactly ``want`` wait for room
    (the raylets' queues, as ``ray status`` shows them under "Pending Demands"; a second or so
    behind). Not those whose node is starting their process: those have their room."""
    import ray
    from ray.autoscaler.v2.sdk import get_cluster_status

    try:
        status = get_cluster_status(ray.get_runtime_context().gcs_address)
    except Exception:  # noqa: BLE001 - the GCS unreachable for a moment
        return 0
    return sum(
        r.count
        for demand in status.resource_demands.ray_task_actor_demand
        for r in demand.bundles_by_count
        if {k: v for k, v in r.bundle.items() if v} == want
    )


def never_placed(want: dict, nodes: List[dict]) -> Optional[str]:
    """Why no node of the cluster can ever hold ``want`` (None when one can): the resources
    no node has at all, or has too little of."""
    if any(fits(want, n["total"]) for n in nodes):
        return None
    absent = [k for k in want if not any(k in n["total"] for n in nodes)]
    if absent:
        return f"no node of the cluster has {' or '.join(repr(k) for k in sorted(absent))}"
    most = {k: max(n["total"].get(k, 0.0) for n in nodes) for k in want}
    return f"no node has that much (the most one node has: {resources_text(most)})"


def free_text(want: dict, nodes: List[dict]) -> str:
    """What the cluster has free of ``want``'s resources, e.g. ``0 CPU free of 3``."""
    parts = []
    for k in sorted(want):
        free = sum(n["free"].get(k, 0.0) for n in nodes)
        total = sum(n["total"].get(k, 0.0) for n in nodes)
        parts.append(f"{free:g} {k} free of {total:g}")
    return ", ".join(parts)


def node_name(node_id: str, nodes: List[dict]) -> str:
    """A node as lines name it: its address and the start of its Ray id."""
    ip = next((n["ip"] for n in nodes if n["id"] == node_id), "?")
    return f"{ip} ({node_id[:8]})"


# ---------------------------------------------------------------------------------------------
# The actor table.


def _cause(info: dict) -> str:
    """An actor's cause of death in a few words (from Ray's ActorDeathCause)."""
    cause = info.get("DeathCause")
    try:
        which = cause.WhichOneof("context")
    except (AttributeError, ValueError):
        return "its process died"
    if which == "actor_died_error_context":
        reason = cause.actor_died_error_context.Reason.Name(cause.actor_died_error_context.reason)
        return {
            "NODE_DIED": "its node was lost",
            "WORKER_DIED": "its process died",
            "RAY_KILL": "killed by ray.kill",
            "OWNER_DIED": "its driver died",
        }.get(reason, f"its process died ({reason.lower()})")
    if which == "oom_context":
        return "its node ran out of memory"
    if which == "creation_task_failure_context":
        return "its constructor raised"
    if which == "actor_unschedulable_context":
        return "it cannot be placed"
    return "its process died"


class ActorWatch:
    """The run's actors as Ray's actor table shows them, polled by the driver
    (:meth:`poll`, about once a second): each change is one line, and :meth:`report` counts
    them for the learner's closing line.

    Args:
      handles: the actors' Ray handles, in actor order (actor k is ``handles[k]``).
      restarts: ``RayConfig.actor_restarts`` (-1: without limit).
      table: ``actor id (hex) -> info`` as ``ray._private.state.state.actor_table``
        returns it (tests pass their own).
      nodes: :func:`alive_nodes` (tests pass their own).
    """

    def __init__(
        self,
        handles: list,
        restarts: int,
        *,
        table: Optional[Callable[[str], dict]] = None,
        nodes: Callable[[], List[dict]] = alive_nodes,
    ):
        if table is None:
            from ray._private import state

            table = state.state.actor_table
        self._ids = [h._actor_id.hex() for h in handles]
        self._table, self._nodes = table, nodes
        self._restarts = restarts
        self._seen: Dict[int, dict] = {}  # actor -> its last row: state, pid, node, restarts
        self.placed: set = set()  # actors that have been given a process, ever
        self.lost = 0  # losses Ray noticed (a process or node that died)
        self.restarted = 0  # restarts that came back
        self.gone = 0  # actors dead for good
        self._restarting: set = set()  # actors lost, being restarted

    def _rows(self) -> Dict[int, dict]:
        rows = {}
        for k, actor_id in enumerate(self._ids):
            try:
                info = self._table(actor_id) or {}
            except Exception:  # noqa: BLE001 - the GCS unreachable for a moment
                continue
            rows[k] = {
                "state": info.get("State", "?"),
                "pid": int(info.get("Pid") or 0),
                "node": (info.get("Address") or {}).get("NodeID", ""),
                "restarts": int(info.get("NumRestarts") or 0),
                "info": info,
            }
        return rows

    @staticmethod
    def _has_process(row: dict) -> bool:
        return row["state"] == "ALIVE" or (row["state"] == "PENDING_CREATION" and row["pid"] > 0)

    def pending(self) -> List[int]:
        """Actors not placed yet (as of the last :meth:`poll`)."""
        return [k for k in range(len(self._ids)) if k not in self.placed]

    def poll(self, say: bool = True) -> List[str]:
        """Reads the table; returns (and with ``say`` logs) one line per change since the last
        call: an actor placed, lost (Ray restarts it, or it is gone for good), restarted."""
        rows = self._rows()
        nodes: Optional[List[dict]] = None
        lines = []
        for k, row in sorted(rows.items()):
            before = self._seen.get(k)
            self._seen[k] = row
            was, now = (before or {}).get("state"), row["state"]
            if now == "DEAD":
                if was not in (None, "DEAD"):
                    self.lost += was == "ALIVE"
                    self.gone += 1
                    self._restarting.discard(k)
                    lines.append(f"ray: actor {k} is gone for good ({_cause(row['info'])})")
                continue
            if now == "RESTARTING":
                if k not in self._restarting:
                    self._restarting.add(k)
                    self.lost += 1
                    number = max(row["restarts"], (before or row)["restarts"] + 1)
                    limit = "" if self._restarts < 0 else f" of {self._restarts}"
                    if nodes is None:
                        nodes = self._nodes()
                    cause = _cause(row["info"])
                    if before and before["node"] and all(n["id"] != before["node"] for n in nodes):
                        cause = "its node was lost"  # Ray may name its process's death first
                    lines.append(
                        f"ray: actor {k} lost ({cause}); Ray restarts it (restart {number}{limit})"
                    )
                continue
            if not self._has_process(row):
                continue
            if nodes is None:
                nodes = self._nodes()
            where = node_name(row["node"], nodes) if row["node"] else "a node"
            if k not in self.placed:
                self.placed.add(k)
                if before is not None:  # placed after the first report
                    lines.append(
                        f"ray: actor {k} placed on {where} "
                        f"({len(self.placed)} of {len(self._ids)} placed)"
                    )
            if now != "ALIVE":
                continue
            if k in self._restarting:
                self._restarting.discard(k)
                self.restarted += 1
                lines.append(f"ray: actor {k} restarted on {where}")
            elif was == "ALIVE" and row["restarts"] > before["restarts"]:  # between two polls
                missed = row["restarts"] - before["restarts"]
                self.lost += missed
                self.restarted += missed
                lines.append(f"ray: actor {k} lost and restarted on {where}")
        if say:
            for line in lines:
                log.info("%s", line)
        return lines

    def report(self) -> str:
        """The actors' figures for the learner's closing line."""
        return (
            f"Ray actors: {len(self.placed)} of {len(self._ids)} placed, {self.lost} lost, "
            f"{self.restarted} restarted"
        )
