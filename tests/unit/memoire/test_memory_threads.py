"""memoire.ReplayMemory under threads: one adds while others sample and update weights, the GIL
is released in long calls, and a frame_stack change racing a sample never corrupts a batch.

Every loop is bounded in count; nothing asserts on time.
"""

import sys
import threading
import time

import numpy as np

import memoire

FLOAT = np.float32


def make(max_step, state_shape=(1,), state_dtype=np.int64):
    rem = memoire.ReplayMemory(
        np.zeros(state_shape, state_dtype),
        np.zeros([], FLOAT),
        np.zeros([], FLOAT),
        np.zeros([], FLOAT),
        np.zeros([], FLOAT),
        np.zeros([], FLOAT),
        np.zeros([0], np.uint8),
        max_step,
    )
    rem.seed(0)
    return rem


def rows(first, n, state_shape=(1,), state_dtype=np.int64):
    pos = np.arange(first, first + n, dtype=np.int64)
    s = np.broadcast_to(
        pos.reshape((n,) + (1,) * len(state_shape)).astype(state_dtype), (n,) + state_shape
    )
    return (
        np.ascontiguousarray(s),
        pos.astype(FLOAT),
        np.ones(n, FLOAT),
        np.zeros(n, FLOAT),
        np.zeros(n, FLOAT),
        np.zeros([n, 0], np.uint8),
        np.ones(n, FLOAT),
    )


def run_threads(targets):
    errors = []

    def wrap(f):
        def run():
            try:
                f()
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        return run

    threads = [threading.Thread(target=wrap(f)) for f in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]


def test_one_adder_two_samplers():
    rem = make(997)
    rem.frame_stack = 2
    rem.multi_step = 2
    episodes, length = 120, 37
    progress = [0, 0]  # samples taken by each sampler
    seen_max = [[], []]  # the largest id each sampler saw, batch by batch
    done = threading.Event()

    def adder():
        for e in range(episodes):
            rem.new_episode()
            rem.add_entries(*rows(e * length, length))
            rem.close_episode(terminal=bool(e % 2))
            # Let both samplers see this stage before the next one (bounded handshake).
            target = [p + 1 for p in progress]
            for _ in range(20000):
                if all(p >= t for p, t in zip(progress, target)):
                    break
                time.sleep(0.0005)
            else:
                raise AssertionError("samplers made no progress")
        done.set()

    def sampler(k):
        def run():
            for _ in range(200000):
                if done.is_set():
                    return
                if rem.num_sampleable == 0:
                    time.sleep(0.0005)
                    continue
                b = rem.get_batch(32)
                # Stacks stay inside one episode: prev is [id-1, id], next two steps on.
                np.testing.assert_array_equal(b.prev[0][:, :, 0], b.id[:, None] + [-1, 0])
                np.testing.assert_array_equal(b.next[0][:, :, 0], b.id[:, None] + [1, 2])
                assert ((b.id % length) >= 1).all() and ((b.id % length) <= length - 3).all()
                rem.update_weights(b.id, np.full(32, 0.5 + k, FLOAT))
                seen_max[k].append(int(b.id.max()))
                progress[k] += 1
            raise AssertionError("sampler loop bound reached")

        return run

    run_threads([adder, sampler(0), sampler(1)])
    assert rem.num_episode() == 997 // length
    assert rem.size == (997 // length) * length
    assert rem.total_added == episodes * length
    assert rem.num_sampleable == (997 // length) * (length - 3)
    for k in range(2):
        assert progress[k] >= episodes
        # The samplers watched the memory grow: late batches hold ids of late episodes.
        assert seen_max[k][-1] >= (episodes - 2) * length > seen_max[k][0]
    b = rem.get_batch(64)
    assert (b.id >= (episodes - 997 // length) * length).all()
    assert set(np.unique(b.weight).tolist()) <= {0.5, 1.0, 1.5}


def test_gil_is_released_during_a_long_add():
    """While one thread is inside add_entries (C++), another thread keeps sampling.

    The switch interval is raised so that, were the GIL held through the C++ call, the sampling
    thread could not run during it at all; the count of samples taken between the adder's
    before/after reads then shows the release.
    """
    big = make(4000, state_shape=(84, 84), state_dtype=np.uint8)
    other = make(100)
    other.new_episode()
    other.add_entries(*rows(0, 50))
    other.close_episode()
    data = rows(0, 4000, state_shape=(84, 84), state_dtype=np.uint8)
    count = [0]
    during = []
    stop = threading.Event()

    def adder():
        for _ in range(8):
            big.new_episode()
            c0 = count[0]
            big.add_entries(*data)  # 4000 Atari frames, 28 MB: a long copy
            during.append(count[0] - c0)
            big.close_episode()
        stop.set()

    def sampler():
        for _ in range(10**7):
            if stop.is_set():
                return
            other.get_batch(8)
            count[0] += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:
        run_threads([adder, sampler])
    finally:
        sys.setswitchinterval(old)
    assert big.num_episode() == 1 and big.size == 4000
    assert sum(during) >= 8 * 5, during


def test_frame_stack_changes_race_sampling_safely():
    rem = make(500)
    for e in range(10):
        rem.new_episode()
        rem.add_entries(*rows(e * 40, 40))
        rem.close_episode()
    stop = threading.Event()
    shapes = []

    def toggler():
        for k in range(10**7):
            if stop.is_set():
                return
            rem.frame_stack = 4 if k % 2 else 1
        raise AssertionError("toggler loop bound reached")

    def sampler():
        try:
            for _ in range(400):
                b = rem.get_batch(16)
                fs = b.prev[0].shape[1]
                shapes.append(fs)
                assert b.next[0].shape[1] == fs and b.prev[6].shape[1] == fs
                np.testing.assert_array_equal(
                    b.prev[0][:, :, 0], b.id[:, None] + np.arange(fs) - (fs - 1)
                )
        finally:
            stop.set()

    run_threads([toggler, sampler])
    assert len(shapes) == 400 and set(shapes) <= {1, 4}
