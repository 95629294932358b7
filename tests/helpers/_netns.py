"""Test hosts on this machine: network namespaces joined by veth links of a given rate.

A :class:`TestHosts` makes two or three hosts, each a network namespace of its own (its own
interfaces, addresses, routes and TCP stack), and links each host after the first to the first
(the hub) with a veth pair, shaped in both directions by a token bucket (``tc ... tbf``) when
a rate is given. It runs commands in them (``ip netns exec``), takes links down and up (a
partition), and removes everything it made when it closes, also when the test body failed or
was interrupted: the processes it started (their process groups, then anything left in its
namespaces), then the namespaces, and with them their veth pairs. A namespace left by a run
that was killed outright is removed by the next run (its creator's process is gone).

Addresses: link k (1-based) is 10.231.k.0/24, the hub 10.231.k.1, host k 10.231.k.2 (whose
default route is the hub: every host reaches every address of the hub). They exist only inside
the namespaces made here: nothing else is ever a target, and the host's own interfaces are
never touched.

Needs Linux, root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2 (``ip``, and ``tc`` for a
rate). :func:`unavailable` says why not where they are missing; tests then skip, saying so::

    reason = _netns.unavailable()
    if reason: pytest.skip(reason)
    with TestHosts(("server", "learner"), rate=1e9) as hosts:
        server = hosts.popen("server", [sys.executable, "serve.py", hosts.address("server")])
        ...

Needs nothing of memoire.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

PREFIX = "memoire-t"  # every namespace made here: memoire-t<creator pid>-<serial>-<host>
_NAME = re.compile(rf"^{PREFIX}(\d+)-(\d+)-([a-z0-9]+)$")
SUBNET = "10.231"  # link k is 10.231.k.0/24
STOP_S = 5.0  # seconds a process gets between SIGTERM and SIGKILL at close
_serial = [0]
_unavailable: List[Optional[str]] = []  # the cached answer of unavailable()


def _ip(*args: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Runs ``ip ARGS`` (bounded by `timeout` seconds); RuntimeError with its stderr when it
    fails and `check`."""
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def _tc(netns: str, *args: str) -> None:
    done = subprocess.run(
        ["ip", "netns", "exec", netns, "tc", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)} in {netns}: {done.stderr.strip()}")


def namespaces() -> List[str]:
    """The names of this machine's named network namespaces (``ip netns list``)."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def unavailable() -> Optional[str]:
    """None where this process can make test hosts, else why not (for ``pytest.skip``). Tries
    once per process: makes a namespace and removes it."""
    if not _unavailable:
        _unavailable.append(_why_unavailable())
    return _unavailable[0]


def _why_unavailable() -> Optional[str]:
    if not sys.platform.startswith("linux"):
        return f"test hosts need Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces, veth links): run the tests as root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"test hosts need iproute2 ({', '.join(missing)} not found)"
    probe = f"{PREFIX}{os.getpid()}-0-probe"
    try:
        _ip("netns", "add", probe)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return f"test hosts: this process cannot make a network namespace ({e})"
    _ip("netns", "delete", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_inside(netns: str) -> None:
    """SIGKILLs every process still in `netns` (processes the helper's commands started)."""
    out = _ip("netns", "pids", netns, check=False).stdout
    for word in out.split():
        try:
            os.kill(int(word), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass


def remove_stale() -> List[str]:
    """Removes the namespaces this helper made in processes that are gone (a run killed before
    it could clean up), and what runs in them. Returns their names."""
    gone = []
    for name in namespaces():
        m = _NAME.match(name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            _kill_inside(name)
            _ip("netns", "delete", name, check=False)
            gone.append(name)
    return gone


def _burst(rate: float) -> int:
    """The token bucket's burst for `rate` bits/s: 2 ms of the rate, at least 32 KiB (a burst
    below what the timer can refill caps the rate below what was asked)."""
    return max(32 << 10, int(rate / 8 / 500))


class TestHosts:
    """Network namespaces joined to the first by veth links (see the module docstring).

    Args:
      names: the hosts, 2 or 3 short lowercase names (letters and digits); the first is the
        hub every other host links to.
      rate: bits/s of every link, each direction (a ``tbf`` qdisc on both ends); None leaves
        the links unshaped (veth: as fast as the CPU copies).

    Not thread-safe. Use as a context manager (or call :meth:`close`): leaving the block
    removes everything made here, whatever happened in it.

    Raises:
      ValueError: bad names or rate. RuntimeError: a namespace, link or qdisc could not be
        made (what was made is removed first).
    """

    __test__ = False  # not a pytest test class

    def __init__(self, names: Sequence[str] = ("a", "b"), rate: Optional[float] = None):
        names = tuple(names)
        if not 2 <= len(names) <= 3 or len(set(names)) != len(names):
            raise ValueError(f"names: expected 2 or 3 distinct hosts, got {names!r}")
        for name in names:
            if not re.fullmatch(r"[a-z0-9]{1,12}", name):
                raise ValueError(f"host name: expected 1-12 of [a-z0-9], got {name!r}")
        if rate is not None and not (isinstance(rate, (int, float)) and rate >= 8e3):
            raise ValueError(f"rate: expected bits/s >= 8000 or None, got {rate!r}")
        self.names = names
        self.rate = None if rate is None else float(rate)
        self.hub = names[0]
        self._procs: List[subprocess.Popen] = []
        self._down: Dict[str, float] = {}  # host: time.monotonic() its link went down
        self._closed = False
        remove_stale()
        _serial[0] += 1
        self.netns: Dict[str, str] = {
            name: f"{PREFIX}{os.getpid()}-{_serial[0]}-{name}" for name in names
        }
        try:
            for name in names:
                _ip("netns", "add", self.netns[name])
                _ip("-n", self.netns[name], "link", "set", "lo", "up")
            for k, name in enumerate(names[1:], start=1):
                self._link(k, name)
            for name in names[1:]:
                self._wait_carrier(name)
        except BaseException:
            self.close()
            raise

    # ---- the links

    def _link(self, k: int, name: str) -> None:
        hub_ns, ns = self.netns[self.hub], self.netns[name]
        hub_dev, dev = self.device(self.hub, name), self.device(name, self.hub)
        # Both ends made straight in their namespaces: nothing appears in this one.
        veth = ["type", "veth", "peer", "name", dev, "netns", ns]
        _ip("link", "add", hub_dev, "netns", hub_ns, *veth)
        for netns, device, host in ((hub_ns, hub_dev, 1), (ns, dev, 2)):
            _ip("-n", netns, "addr", "add", f"{SUBNET}.{k}.{host}/24", "dev", device)
            _ip("-n", netns, "link", "set", device, "up")
            if host == 2:  # the hub's other links (and their hosts) are through the hub
                _ip("-n", netns, "route", "add", "default", "via", f"{SUBNET}.{k}.1")
            if self.rate is not None:
                rate = f"{int(self.rate)}bit"
                burst = str(_burst(self.rate))
                _tc(netns, "qdisc", "add", "dev", device, "root", "tbf", "rate", rate,
                    "burst", burst, "latency", "100ms")  # fmt: skip

    def _wait_carrier(self, name: str, timeout: float = 10.0) -> None:
        """Waits until host `name`'s end of its link is up (a veth takes a moment)."""
        deadline = time.monotonic() + timeout
        while True:
            out = _ip("-n", self.netns[name], "-br", "link", "show", "dev", "link0").stdout
            if " UP " in f" {out} ":
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the link of {name} is not up after {timeout:g} s: {out}")
            time.sleep(0.02)

    def _index(self, name: str) -> int:
        if name not in self.names or name == self.hub:
            raise ValueError(f"expected one of the linked hosts {self.names[1:]}, got {name!r}")
        return self.names.index(name)

    def device(self, name: str, toward: str) -> str:
        """The name of `name`'s end of the link toward `toward` (in `name`'s namespace)."""
        if name == self.hub:
            return f"hub{self._index(toward)}"
        self._index(name)
        return "link0"

    def address(self, name: str, toward: Optional[str] = None) -> str:
        """The address of host `name` on its link: for the hub, on the link toward `toward`
        (by default the second host's link)."""
        if name == self.hub:
            return f"{SUBNET}.{self._index(toward or self.names[1])}.1"
        return f"{SUBNET}.{self._index(name)}.2"

    def set_link(self, name: str, up: bool) -> None:
        """Takes the link between the hub and host `name` down (``ip link set ... down`` on
        the hub's end: the other end loses its carrier) or brings it back up."""
        device = self.device(self.hub, name)
        _ip("-n", self.netns[self.hub], "link", "set", device, "up" if up else "down")
        if up:
            self._down.pop(name, None)
        else:
            self._down.setdefault(name, time.monotonic())

    def partitioned_for(self, name: str) -> float:
        """Seconds since the link to host `name` went down (0 while it is up)."""
        since = self._down.get(name)
        return 0.0 if since is None else time.monotonic() - since

    def lose(self, name: str) -> None:
        """Host `name` is lost: every process in it is killed at once (SIGKILL), as when a
        machine dies. Its namespace and link stay (for :meth:`close`)."""
        _kill_inside(self.netns[name])

    def link_bytes(self, name: str, toward: str) -> Dict[str, int]:
        """``{'tx': bytes, 'rx': bytes}`` counted by `name`'s end of its link to `toward`."""
        device = self.device(name, toward)
        path = f"/sys/class/net/{device}/statistics"
        out = self.run(name, ["cat", f"{path}/tx_bytes", f"{path}/rx_bytes"], timeout=10)
        tx, rx = (int(x) for x in out.stdout.split())
        return {"tx": tx, "rx": rx}

    # ---- commands

    def command(self, name: str, argv: Sequence[str]) -> List[str]:
        """`argv` run in host `name`'s namespace."""
        return ["ip", "netns", "exec", self.netns[name], *argv]

    def popen(self, name: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Starts `argv` in host `name` (its own process group), stopped at :meth:`close`.
        `kwargs` go to ``subprocess.Popen``."""
        if self._closed:
            raise RuntimeError("TestHosts: closed")
        proc = subprocess.Popen(self.command(name, argv), start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def run(
        self, name: str, argv: Sequence[str], timeout: float, check: bool = True, **kwargs
    ) -> subprocess.CompletedProcess:
        """Runs `argv` in host `name` to its end (at most `timeout` seconds); output captured
        as text. With `check`, a non-zero exit raises RuntimeError with its stderr."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        done = subprocess.run(self.command(name, argv), timeout=timeout, check=False, **kwargs)
        if check and done.returncode != 0:
            raise RuntimeError(f"{argv[0]} in {name} exited {done.returncode}: {done.stderr}")
        return done

    # ---- the end

    def _stop(self, proc: subprocess.Popen) -> None:
        if proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_S), (signal.SIGKILL, STOP_S)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def close(self) -> None:
        """Stops the processes started here, then removes the namespaces (and their links).
        Idempotent; runs to its end whatever fails on the way."""
        if self._closed:
            return
        self._closed = True
        for proc in self._procs:
            try:
                self._stop(proc)
            except Exception:  # noqa: BLE001 - the namespaces must go anyway
                pass
        deadline = time.monotonic() + 10.0
        for netns in getattr(self, "netns", {}).values():
            _kill_inside(netns)
            # A namespace goes with its last process; `ip netns delete` only unmounts its name.
            while _ip("netns", "pids", netns, check=False).stdout.strip():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            _ip("netns", "delete", netns, check=False)

    def __enter__(self) -> "TestHosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
