"""A hypothesis state machine: random episodes, settings changes and samples against a plain
Python model of which entries memoire.ReplayMemory stores and which it may sample."""

import collections

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import memoire

FLOAT = np.float32
WEIGHTS = st.sampled_from([0.0, 0.5, 1.0, 2.0])


class MemoryMachine(RuleBasedStateMachine):
    @initialize(capacity=st.sampled_from([3, 5, 7, 13]), seed=st.integers(0, 2**32))
    def init(self, capacity, seed):
        self.cap = capacity
        self.rem = memoire.ReplayMemory(
            np.zeros([1], np.int64),
            np.zeros([], FLOAT),
            np.zeros([], FLOAT),
            np.zeros([], FLOAT),
            np.zeros([], FLOAT),
            np.zeros([], FLOAT),
            np.zeros([0], np.uint8),
            capacity,
        )
        self.rem.seed(seed)
        self.episodes = collections.deque()  # [start, weights(list)], oldest first
        self.open = None  # weights of the open episode, or None
        self.open_start = 0
        self.tail = 0
        self.fs, self.ms, self.max_episode = 1, 1, 0

    # ---------------------------------------------------------------- the model

    def head(self):
        if self.episodes:
            return self.episodes[0][0]
        return self.open_start if self.open is not None else self.tail

    def evict_for_max_episode(self):
        while self.max_episode and len(self.episodes) > self.max_episode:
            self.episodes.popleft()

    def rule_ok(self):
        """{id: weight} of closed entries that pass the frame_stack/multi_step rule."""
        out = {}
        for start, ws in self.episodes:
            for k in range(self.fs - 1, len(ws) - self.ms):
                out[start + k] = ws[k]
        return out

    def sampleable(self):
        return {i for i, w in self.rule_ok().items() if w > 0}

    def add(self, weights):
        for w in weights:
            while self.tail - self.head() >= self.cap:
                self.episodes.popleft()
            self.open.append(w)
            self.tail += 1

    def rows(self, n):
        pos = np.arange(self.tail, self.tail + n, dtype=np.int64)
        return (
            pos[:, None],
            pos.astype(FLOAT),
            np.ones(n, FLOAT),
            np.zeros(n, FLOAT),
            np.zeros(n, FLOAT),
            np.zeros([n, 0], np.uint8),
        )

    # ---------------------------------------------------------------- rules

    @rule()
    def new_episode(self):
        self.rem.new_episode()
        if self.open is not None:
            self.tail = self.open_start
        self.open, self.open_start = [], self.tail

    @rule(w=WEIGHTS)
    def add_entry(self, w):
        s, a, r, p, v, i = self.rows(1)
        if self.open is None:
            with pytest.raises(RuntimeError):
                self.rem.add_entry(s[0], a[0], r[0], p[0], v[0], i[0], w)
        elif len(self.open) + 1 > self.cap:
            with pytest.raises(memoire.CapacityError):
                self.rem.add_entry(s[0], a[0], r[0], p[0], v[0], i[0], w)
        else:
            self.rem.add_entry(s[0], a[0], r[0], p[0], v[0], i[0], w)
            self.add([w])

    @rule(ws=st.lists(WEIGHTS, max_size=9))
    def add_entries(self, ws):
        rows = self.rows(len(ws))
        if self.open is None:
            with pytest.raises(RuntimeError):
                self.rem.add_entries(*rows, np.array(ws, FLOAT))
        elif len(self.open) + len(ws) > self.cap:
            with pytest.raises(memoire.CapacityError):
                self.rem.add_entries(*rows, np.array(ws, FLOAT))
        else:
            self.rem.add_entries(*rows, np.array(ws, FLOAT))
            self.add(ws)

    @rule(terminal=st.booleans())
    def close_episode(self, terminal):
        if not self.open:  # closed, or open with no entries
            with pytest.raises(RuntimeError):
                self.rem.close_episode(terminal=terminal)
            return
        self.rem.close_episode(terminal=terminal)
        self.episodes.append([self.open_start, self.open])
        self.open, self.open_start = None, self.tail
        self.evict_for_max_episode()

    @rule(fs=st.integers(1, 4), ms=st.integers(1, 3))
    def set_stack_and_steps(self, fs, ms):
        # Set one at a time, as a user would; each must keep fs + ms <= max_step.
        for name, value in (("frame_stack", fs), ("multi_step", ms)):
            new_fs = value if name == "frame_stack" else self.fs
            new_ms = value if name == "multi_step" else self.ms
            if new_fs + new_ms > self.cap:
                with pytest.raises(ValueError):
                    setattr(self.rem, name, value)
            else:
                setattr(self.rem, name, value)
                self.fs, self.ms = new_fs, new_ms

    @rule(n=st.integers(0, 4))
    def set_max_episode(self, n):
        self.rem.max_episode = n
        self.max_episode = n
        self.evict_for_max_episode()

    @rule(n=st.integers(1, 40))
    def sample(self, n):
        good = self.sampleable()
        if not good:
            with pytest.raises(RuntimeError):
                self.rem.get_batch(n)
            return
        b = self.rem.get_batch(n)
        ids = b.id.tolist()
        assert set(ids) <= good
        offsets = np.arange(self.fs) - (self.fs - 1)
        np.testing.assert_array_equal(b.prev[0][:, :, 0], b.id[:, None] + offsets)
        np.testing.assert_array_equal(b.next[0][:, :, 0], b.id[:, None] + offsets + self.ms)
        weights = self.rule_ok()
        np.testing.assert_array_equal(b.weight, [weights[i] for i in ids])

    @precondition(lambda self: self.tail > 0)
    @rule(data=st.data())
    def update_weights(self, data):
        ids = data.draw(st.lists(st.integers(-2, self.tail + 2), max_size=6))
        ws = data.draw(st.lists(WEIGHTS, min_size=len(ids), max_size=len(ids)))
        ok = self.rule_ok()
        expected = sum(1 for i in ids if i in ok)
        assert self.rem.update_weights(np.array(ids, np.int64), np.array(ws, FLOAT)) == expected
        for start, episode in self.episodes:
            for i, w in zip(ids, ws):
                if i in ok and start <= i < start + len(episode):
                    episode[i - start] = w

    # ---------------------------------------------------------------- invariants

    @invariant()
    def counts_match(self):
        rem = self.rem
        assert rem.num_episode() == len(self.episodes)
        assert rem.size == self.tail - self.head()
        assert rem.size <= self.cap
        assert rem.episode_open == (self.open is not None)
        assert rem.open_length == (len(self.open) if self.open is not None else 0)
        assert rem.num_sampleable == len(self.sampleable())
        assert rem.total_weight == pytest.approx(sum(self.rule_ok().values()))
        assert (rem.frame_stack, rem.multi_step, rem.max_episode) == (
            self.fs,
            self.ms,
            self.max_episode,
        )


MemoryMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
TestMemoryMachine = MemoryMachine.TestCase
