"""A SLURM cluster of two test hosts (tests/helpers/_netns.py): slurmctld and one slurmd on the first,
a slurmd on the second, each daemon in its host's network namespace and known to the other by
its namespace address, so every SLURM message and every task's traffic between the nodes
crosses the shaped link. The cluster is this test's alone: its own munged (key, socket),
state and ports, so it runs beside the one-node cluster of scripts/slurm_local.sh.

The nodes are ``node1`` (the hub: the controller, and the node the job's task 0, the learner,
runs on) and ``node2``. Each ``slurmd -N`` has its own spool folder and pid file (``%n`` in
slurm.conf); both use one munged (its socket is a file, reachable from every namespace).
Commands that talk to the controller (sbatch, scontrol, scancel) run in node1
(:meth:`SlurmHosts.run`).

``node1`` has as many CPUs as one task asks for (``learner_cpus``), so SLURM's block layout of
a job of ``--nodes=2`` puts task 0 alone there and every other task on node2.

Needs root, iproute2 and Debian's slurm-wlm and munge (``scripts/slurm_local.sh install``);
:func:`unavailable` says why not.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from typing import Optional

from _netns import TestHosts
from _netns import unavailable as netns_unavailable
from _waiting import wait_until

NODES = ("node1", "node2")
DAEMONS = ("sbatch", "scontrol", "scancel", "slurmctld", "slurmd", "munged")
# Seconds without an answer from a slurmd before slurmctld marks its node DOWN (the default is
# 300: a lost node would hold the job for five minutes).
SLURMD_TIMEOUT_S = 10
UP_S = 60.0  # the nodes come up within this on a loaded 2-core machine
CRED_EXPIRE_S = 20  # a step's credential lifetime (s), also a requeued job's wait
# The machine's cgroup v1 hierarchies, mounted again in each slurmd's namespace.
CGROUPS_V1 = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "pids", "name=systemd")


def unavailable() -> Optional[str]:
    """None where this process can run the cluster, else why not (for ``pytest.skip``)."""
    reason = netns_unavailable()
    if reason:
        return reason
    missing = [c for c in DAEMONS if shutil.which(c) is None]
    if missing:
        return (
            f"SLURM is not installed ({', '.join(missing)} not found): "
            "scripts/slurm_local.sh install (root, Debian's slurm-wlm and munge)"
        )
    return None


class SlurmHosts:
    """Two test hosts running a SLURM cluster of two nodes (see the module).

    Args:
      folder: str, where slurm.conf, the daemons' state, spool folders and logs go.
      rate: bits/s of the link between the hosts (each direction).
      learner_cpus: CPUs of node1 (a job's task 0 fills it); node2 has 8.

    Use as a context manager: leaving it stops the daemons and removes the hosts.
    """

    def __init__(self, folder: str, rate: float = 1e8, learner_cpus: int = 1):
        self.folder = folder
        self.conf = os.path.join(folder, "slurm.conf")
        for sub in ("state", "spool", "log"):
            os.makedirs(os.path.join(folder, sub), exist_ok=True)
        self.hosts = TestHosts(NODES, rate=rate)
        try:
            self.env = dict(os.environ, SLURM_CONF=self.conf)
            self.munge_socket = self._start_munged()
            self._write_conf(learner_cpus)
            ctld = ["slurmctld", "-D", "-c", "-f", self.conf]
            self.daemons["slurmctld"] = self._daemon("node1", ctld)
            for node in NODES:
                os.makedirs(os.path.join(folder, "spool", node), exist_ok=True)
                self.start_slurmd(node)
            wait_until(self._up, "both nodes idle", timeout=UP_S)
        except BaseException:
            self.close()
            raise

    def _slurmd(self, node: str) -> list:
        # `ip netns exec` mounts a sysfs of the namespace's own, without the cgroup folders
        # slurmd looks at: mount the machine's cgroup v1 hierarchies there again (in that
        # command's mount namespace only; slurmd refuses a v1 and v2 mix).
        mounts = ["mount -t tmpfs cgroup_root /sys/fs/cgroup"]
        for c in CGROUPS_V1:
            folder = c.replace("name=", "")
            mounts.append(f"mkdir -p /sys/fs/cgroup/{folder}")
            mounts.append(f"mount -t cgroup -o {c} cgroup /sys/fs/cgroup/{folder}")
        slurmd = f"exec slurmd -D -N {node} -f {self.conf}"
        return ["sh", "-c", " && ".join(mounts + [slurmd])]

    def _start_munged(self) -> str:
        """Starts this cluster's munged (a key of its own; --force: as root, in a folder of
        root's); returns its socket's path."""
        d = os.path.join(self.folder, "munge")
        os.makedirs(d, mode=0o755, exist_ok=True)
        key = os.path.join(d, "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400), "wb") as f:
            f.write(os.urandom(1024))
        sock = os.path.join(d, "munge.socket")
        argv = ["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}"]
        argv += [f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log"]
        argv += [f"--seed-file={d}/munged.seed"]
        self.daemons = {"munged": self._daemon("node1", argv)}
        wait_until(lambda: os.path.exists(sock) or self.daemons["munged"].poll() is not None,
                   "munged's socket", timeout=UP_S)  # fmt: skip
        if not os.path.exists(sock):
            raise RuntimeError(f"munged exited {self.daemons['munged'].returncode}")
        return sock

    def _daemon(self, node: str, argv: list) -> subprocess.Popen:
        # Their logs are files (slurm.conf); what they print is a copy.
        out = subprocess.DEVNULL
        return self.hosts.popen(node, argv, env=self.env, stdout=out, stderr=out)

    def start_slurmd(self, node: str) -> None:
        """Starts `node`'s slurmd (again, after :meth:`TestHosts.lose`: the node comes back,
        ``ReturnToService=2``)."""
        self.daemons[node] = self._daemon(node, self._slurmd(node))

    def _up(self) -> bool:
        for name, proc in self.daemons.items():
            if proc.poll() is not None:
                log = self.log(name if name in ("slurmctld", "munged") else f"slurmd-{name}")
                raise RuntimeError(f"{name}'s daemon exited {proc.returncode}: {log[-2000:]}")
        return self.idle() == set(NODES)

    def address(self, node: str) -> str:
        """The namespace address of `node`."""
        return self.hosts.address(node)

    def _write_conf(self, learner_cpus: int) -> None:
        d = self.folder
        mem = 4096
        lines = [
            "ClusterName=memoire2",
            # slurmctld runs only where the machine's name is a SlurmctldHost; every namespace
            # has that name: its address says which host it is.
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({self.address('node1')})",
            # Fixed ports: each namespace has ports of its own.
            "SlurmctldPort=6817",
            "SlurmdPort=6818",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log",
            f"SlurmdLogFile={d}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "ReturnToService=2",
            "MpiDefault=none",
            f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
            "KillWait=30",
            # This cluster's munged; a requeued job waits cred_expire (+1 s) before it starts
            # again (default 120 s).
            f"AuthInfo=cred_expire={CRED_EXPIRE_S},socket={self.munge_socket}",
            "SlurmdParameters=config_overrides",
            f"NodeName=node1 NodeAddr={self.address('node1')} CPUs={learner_cpus} "
            f"RealMemory={mem} State=UNKNOWN",
            f"NodeName=node2 NodeAddr={self.address('node2')} CPUs=8 RealMemory={mem} "
            "State=UNKNOWN",
            "PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines))

    def run(self, argv, timeout: float = 30.0, check: bool = True, **kwargs):
        """Runs `argv` on node1 with this cluster's SLURM_CONF (see TestHosts.run)."""
        kwargs.setdefault("env", self.env)
        return self.hosts.run("node1", argv, timeout=timeout, check=check, **kwargs)

    def node_states(self) -> dict:
        """{node: its state as sinfo says it (idle, mixed, down*, ...)}; {} while the
        controller does not answer."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def idle(self) -> set:
        return {n for n, s in self.node_states().items() if s == "idle"}

    def job(self, job: str) -> dict:
        """``scontrol show job``'s fields of `job` ({} while the controller does not know it)."""
        out = self.run(["scontrol", "-o", "show", "job", job], check=False).stdout
        return dict(w.split("=", 1) for w in out.split() if "=" in w)

    def log(self, name: str) -> str:
        """The text of log `name` (slurmctld, slurmd-node1, slurmd-node2)."""
        sub = "munge" if name == "munged" else "log"
        path = os.path.join(self.folder, sub, f"{name}.log")
        return open(path).read() if os.path.exists(path) else ""

    def close(self) -> None:
        self.hosts.close()  # every daemon is a process of the hosts

    def __enter__(self) -> "SlurmHosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
