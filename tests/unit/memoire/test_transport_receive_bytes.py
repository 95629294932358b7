"""What waits in a server's receive queues is bounded in bytes: two actors stream Atari-size
episodes (uint8[84, 84] frames) into a server whose rate limiter holds inserts back (nobody
samples). The server reads nothing meanwhile, its PULL queues at most RECEIVE_HWM messages per
connection (plus one its engine holds), so its RSS grows by less than the documented budgets;
the actors' sends block (their progress stops); once sampling resumes every held episode is
stored whole. Counts, never times (the waits are bounded)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
from _subprocess_env import subprocess_env
from _waiting import wait_until

from memoire import ReplayMemoryServer
from memoire.bench.memory import proc_status
from memoire.rate_limiter import SampleToInsertRatio
from memoire.transport import RECEIVE_HWM

FRAME = (84, 84)
STEPS = 200  # per episode
CHUNK = 50  # rows per chunk: 50 x 7056 B = 353 KB a message
EPISODES = 30  # per actor: more than the queues on the way hold
MAX_MESSAGE = 1 << 20
TEMPLATES = (
    np.zeros(FRAME, np.uint8),
    np.zeros([], np.int64),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([], np.float32),
    np.zeros([0], np.uint8),
)

# A central-mode actor: EPISODES episodes of STEPS Atari frames; prints the chunks it has queued,
# then "done", and closes when told (a line on stdin).
ACTOR = r"""
import sys, numpy as np
from memoire import ReplayMemoryClient
pull, rep, seed, steps, chunk, episodes = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
c = ReplayMemoryClient(None, rep, pull, seed, mode="central", chunk_size=chunk, timeout=120)
rng = np.random.default_rng(seed)
frames = rng.integers(0, 256, (steps, 84, 84), np.uint8)
sent = 0
for e in range(episodes):
    c.new_episode()
    for t in range(steps):
        c.add_entry(frames[t], t % 4, 1.0, 0.5, 0.0)
        if (t + 1) % chunk == 0 and t + 1 < steps:
            sent += 1
            print("sent", sent, flush=True)
    c.close_episode()
    sent += 1
    print("sent", sent, flush=True)
print("done", flush=True)
sys.stdin.readline()  # until the test has seen every episode stored (close drops what is queued)
c.close()
"""


def _rss() -> int:
    return proc_status("VmRSS")


class _Actor:
    def __init__(self, ep, seed):
        self.sent = 0
        self.done = False
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ACTOR, ep["pull"], ep["rep"], str(seed), str(STEPS)]
            + [str(CHUNK), str(EPISODES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=subprocess_env(),
            cwd=tempfile.gettempdir(),
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("sent"):
                self.sent = int(line.split()[1])
            elif line.startswith("done"):
                self.done = True


@pytest.mark.slow
def test_held_inserts_wait_in_the_actors_and_are_stored_whole_later():
    max_step = 2 * EPISODES * STEPS
    # Inserts block once about 2 episodes are stored (nobody samples).
    limiter = SampleToInsertRatio(1.0, STEPS, (-100.0, float(STEPS)))
    with ReplayMemoryServer(
        *TEMPLATES, max_step, None, rate_limiter=limiter, max_message_bytes=MAX_MESSAGE
    ) as srv:
        ep = srv.start()
        base = _rss()
        actors = [_Actor(ep, seed) for seed in (1, 2)]
        try:
            # Held: the limiter blocks inserts; the actors fill what queues there are.
            wait_until(lambda: not limiter.can_insert(1), "not limiter.can_insert(1)", timeout=60)
            stalled = 0
            last = None
            peak = 0
            for _ in range(40):  # ~10 s of holding, in 0.25 s looks
                time.sleep(0.25)
                peak = max(peak, _rss() - base)
                now = tuple(a.sent for a in actors)
                stalled = stalled + 1 if now == last else 0
                last = now
            # The actors' sends block: their progress stopped for the last looks.
            assert stalled >= 8, last
            assert not any(a.done for a in actors)
            assert sum(last) < 2 * EPISODES * (STEPS // CHUNK)
            # The documented budgets (docs/LIMITS.md): per connection (RECEIVE_HWM + 1)
            # messages of at most max_message_bytes, the open streams' max_open_bytes, the
            # memory's own rows, and 64 MiB for the process's own churn.
            row = int(np.prod(FRAME)) + 8 + 4 * 4
            budget = (
                2 * (RECEIVE_HWM + 1) * MAX_MESSAGE
                + srv.max_open_bytes
                + max_step * row
                + (64 << 20)
            )
            assert peak < budget, (peak, budget)

            # Sampling resumes: every held episode is stored whole.
            def drain():
                for _ in range(20):
                    try:
                        srv.sample(32, timeout=0.05)
                    except TimeoutError:
                        break
                return srv.stats().get("episodes_in", 0) == 2 * EPISODES

            assert wait_until(drain, "every held episode stored", timeout=120, fail=False), (
                srv.stats(),
                limiter.counters(),
                [a.sent for a in actors],
            )
            assert all(a.done for a in actors)
            s = srv.stats()
            assert s["memory_episodes"] == 2 * EPISODES
            assert s["memory_size"] == 2 * EPISODES * STEPS
            assert s["rejected"] == {}
        finally:
            for a in actors:
                a.proc.kill()
                a.proc.wait(30)
