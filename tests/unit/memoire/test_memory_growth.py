"""Memory grows with what is stored: an empty 1,000,000-transition Atari store (uint8[84, 84]
frames, stack 4) of every kind costs a few MiB of resident memory, adding transitions grows it
by about their frame bytes, and a central-mode actor of such a server holds only chunks.
Resident bytes are measured in a fresh process per case (memoire.bench.empty_rss)."""

import json
import subprocess
import sys

import numpy as np
import pytest
from _subprocess_env import subprocess_env

from memoire import ReplayMemoryClient, ReplayMemoryServer

MiB = 1 << 20
FILL = 4000  # transitions added: 28 MB of frames
# Over the interpreter's baseline. Committing the capacity would take 7 GB of frames; the sum
# tree alone (2**21 doubles) would be 16 MiB, the per-slot records of the stores 10-60 MiB.
EMPTY_BOUND = 8 * MiB
# Beyond the frames added: pages of the sum tree's levels and per-slot records touched by the
# first writes (2 MiB huge pages for large blocks), and allocator slack.
FILL_SLACK = 16 * MiB
EPISODE_BYTES = 1000 * 84 * 84  # frames of one episode of memoire.bench.empty_rss (EPISODE)

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/status"
)


def measure(case, n=FILL):
    out = subprocess.run(
        # -P: the memoire on PYTHONPATH (the one under test), not one in the working folder.
        [sys.executable, "-P", "-m", "memoire.bench.empty_rss", case, str(n)],
        capture_output=True,
        text=True,
        timeout=900,
        env=subprocess_env(),
        check=False,
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@linux_only
@pytest.mark.parametrize(
    "case", ["memory", "dopamine", "dopamine_prioritized", "jax", "jax_prioritized", "server"]
)
def test_an_empty_atari_store_is_small_and_grows_with_its_frames(case):
    if case.startswith("jax"):
        pytest.importorskip("dopamine.jax.replay_memory.replay_buffer")
    r = measure(case)
    assert r["construct"] < EMPTY_BOUND, r
    assert r["size"] >= FILL and r.get("ok", True), r
    slack = FILL_SLACK
    if case == "server":
        # A server also stages each streamed episode until it ends (the ingest's buffers, and
        # the ZeroMQ messages they came in, stay with the allocator for the next episode).
        slack += EPISODE_BYTES
    assert 0.9 * r["raw"] <= r["fill"] <= r["raw"] + slack, r


@linux_only
def test_a_central_mode_actor_holds_chunks_not_a_server_sized_memory():
    r = measure("central_actor")
    assert r["ok"] and r["size"] >= FILL, r  # the server stored every streamed entry
    assert r["construct"] < EMPTY_BOUND, r
    # 28 MB streamed in chunks of 256 entries (1.8 MB each); a few chunks are staged or in
    # flight at a time, and nothing grows with what was sent.
    assert r["fill"] < 12 * MiB, r


TEMPLATES = (
    np.zeros([4], np.float32),
    np.zeros([], np.int64),
    *(np.zeros([], np.float32) for _ in range(4)),
    np.zeros([0], np.uint8),
)


def test_a_central_mode_client_builds_its_local_memory_only_when_read():
    srv = ReplayMemoryServer(*TEMPLATES, 1000, None, seed=0)
    srv.rem.frame_stack = 2
    ep = srv.start()
    try:
        with ReplayMemoryClient(None, ep["rep"], ep["pull"], mode="central", timeout=5) as c:
            assert c._rem is None  # streaming needs no local memory
            for length in (3, 5):
                c.new_episode()
                for k in range(length):
                    c.add_entry(np.full(4, k, np.float32), k, 0.0, 0.5, 0.0)
                c.close_episode()
            assert srv.wait_rows_in(8, 10)
            assert c._rem is None
            assert c.update_counter() == {"total_episodes": 2, "total_steps": 8}
            # Read, it is the server's (settings included), as in cache mode.
            assert c.rem.max_step == 1000 and c.rem.frame_stack == 2 and c.rem.size == 0
            c.sync_sizes(max_step=50)
            assert c._rem is None and c.rem.max_step == 50
            assert c.update_counter() == {"total_episodes": 2, "total_steps": 8}
        with ReplayMemoryClient(None, ep["rep"], ep["pull"], timeout=5) as c:
            assert c._rem is not None and c._rem.max_step == 1000  # cache mode: built at once
    finally:
        srv.close()
