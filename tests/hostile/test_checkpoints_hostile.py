"""Hostile checkpoints (counters, pickles, decompression bombs): counters near 2**63, pickles built from the allowed
globals with crafted numpy dtypes, gzip bombs and lying .npy headers, against the TF face
(uniform and prioritized), the JAX buffer and a remotely hosted buffer.

Each attack runs in a fresh interpreter wherever the unfixed code crashed (a segfault there
fails the test instead of killing pytest). Every refused load raises CheckpointError (a
ValueError naming the file), leaves the buffer as it was, and the buffer still adds and samples.
"""

import subprocess
import sys
import textwrap

import _hostile as h
import numpy as np
import pytest
from _subprocess_env import HELPERS, subprocess_env

from memoire import CapacityError
from memoire.dopamine_compat.checkpoint import CheckpointError

PRIORITIZED = pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])


# The shared check of a refused TF-face load: the error names the file and the expectation, the
# buffer is unchanged, and it still adds and samples.
REFUSED = """
def refused(target, directory, file_name, match):
  from memoire.dopamine_compat.checkpoint import CheckpointError
  before = h.snapshot(target)
  with pytest.raises(CheckpointError, match=match or None) as info:
    target.load(str(directory), 0)
  assert isinstance(info.value, ValueError)
  assert file_name in str(info.value), str(info.value)
  h.assert_same(h.snapshot(target), before)
  h.fill(target, 7, start=100)
  assert int(target.add_count) > before["add_count"]
  target.sample_transition_batch(4)
"""


def run_isolated(body, timeout=300, **values):
    """Runs `body` (source; `np`, `h` (tests/helpers/_hostile), `pytest`, `refused` (above) and `values`
    are defined) in a new interpreter and fails unless it finishes cleanly: a crash there is a
    failure here."""
    prelude = "import numpy as np, pytest\nimport _hostile as h\n" + REFUSED
    prelude += "".join("{} = {!r}\n".format(k, v) for k, v in values.items())
    code = prelude + textwrap.dedent(body) + "\nprint('SURVIVED')\n"
    env = subprocess_env(HELPERS)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=HELPERS,
    )
    assert proc.returncode == 0 and "SURVIVED" in proc.stdout, (
        "exit status {}\n--- stdout\n{}\n--- stderr\n{}".format(
            proc.returncode, proc.stdout[-3000:], proc.stderr[-5000:]
        )
    )
    return proc.stdout


# ---- 1. counters that wrap ----------------------------------------------------------------------


@PRIORITIZED
def test_add_count_attribute_is_bounded(prioritized):
    run_isolated(
        """
    from memoire import CapacityError
    b = h.small_buffer(prioritized)
    h.fill(b, 20)
    before = h.snapshot(b)
    for huge in (2**63 - 1, 2**63, 2**64 + 5, -1, 2**62 + 1):
      with pytest.raises(ValueError, match="add_count"):
        b.add_count = huge
      h.assert_same(h.snapshot(b), before)
    # At the limit itself: allowed, but no add may pass it (nothing written, nothing counted).
    b.add_count = 2**62 - 1
    before = h.snapshot(b)
    with pytest.raises(CapacityError, match="2\\\\*\\\\*62"):
      h.fill(b, 1)
    obs = np.zeros((3, 3), np.uint8)
    with pytest.raises(CapacityError):
      kw = {"priorities": np.ones(3)} if prioritized else {}
      b.add_batch(obs, np.zeros(3, np.int32), np.zeros(3, np.float32), np.zeros(3, np.uint8), **kw)
    h.assert_same(h.snapshot(b), before)
    b.add_count = 20  # back in range: it works again
    h.fill(b, 6, start=50)
    b.sample_transition_batch(4)
  """,
        prioritized=prioritized,
    )


@PRIORITIZED
def test_tampered_add_count_file_is_refused(tmp_path, prioritized):
    run_isolated(
        """
    src = h.small_buffer(prioritized)
    h.fill(src, 23)
    h.saved(src, directory)
    target = h.small_buffer(prioritized, seed=1)
    h.fill(target, 9, start=200)
    name = h.path(directory, "add_count")
    for bad in (np.int64(2**63 - 1), np.uint64(2**64 - 1), np.int64(-1), np.int64(2**62 + 1),
                np.float64(5.0), np.bool_(True)):
      h.write(directory, "add_count", h.npy(np.array(bad)))
      refused(target, directory, name, "add_count")
    for bad in (np.zeros(2, np.int64), np.zeros((), [("a", "<i8")])):  # shape, fields
      h.write(directory, "add_count", h.npy(bad))
      refused(target, directory, name, "expected shape|plain numeric")
  """,
        prioritized=prioritized,
        directory=str(tmp_path),
    )


@PRIORITIZED
def test_consistent_checkpoint_at_the_counter_limit_loads_then_adds_fail_cleanly(
    tmp_path, prioritized
):
    run_isolated(
        """
    from memoire import CapacityError
    from memoire.dopamine_compat import checkpoint
    src = h.small_buffer(prioritized)
    h.fill(src, 23)
    h.saved(src, directory)
    count = 2**62 - 1  # in range, with the invalid_range it implies: a valid checkpoint
    h.write(directory, "add_count", h.npy(np.array(count, np.int64)))
    h.write(directory, "invalid_range",
            h.npy(checkpoint.buffer_invalid_range(src, count)))
    target = h.small_buffer(prioritized, seed=1)
    target.load(directory, 0)
    assert int(target.add_count) == count
    before = h.snapshot(target)
    with pytest.raises(CapacityError, match="add_count"):
      h.fill(target, 1)
    h.assert_same(h.snapshot(target), before)
    target.sample_transition_batch(4)
  """,
        prioritized=prioritized,
        directory=str(tmp_path),
    )


# ---- 2. pickles from the allowed globals ------------------------------------------------------


def crafted_dtypes():
    """(label, dtype opcodes): dtypes that numpy's own unpickling builds unchecked."""
    return [
        ("field at 1 MiB", h.dtype_ops("V8", h.field_at_offset_state(1 << 20))),
        ("float with a field", h.dtype_ops("f8", h.field_at_offset_state(1 << 16))),
        ("subarray of 10**6", h.dtype_ops("f8", h.subarray_state(10**6))),
        ("void subarray", h.dtype_ops("V8", h.subarray_state(4096))),
        ("item size lie", h.dtype_ops("f8", h.lit((3, "<", None, None, None, 4096, 1, 0)))),
        ("object", h.dtype_ops("O", h.plain_dtype_state("|"))),
        ("structured code", h.dtype_ops("i4,i4", None)),
        ("subarray code", h.dtype_ops("(9)f8", None)),
    ]


@PRIORITIZED
def test_crafted_dtype_pickles_are_refused(tmp_path, prioritized):
    ends = []
    for label, dt in crafted_dtypes():
        ends.append((label, h.set_pickle([h.scalar_ops(dt, bytes(8))])))
        ends.append((label + " array", h.set_pickle([h.array_ops((2,), dt, bytes(16))])))
    plain = h.dtype_ops("i8", h.plain_dtype_state())
    ends += [
        ("short scalar", h.set_pickle([h.scalar_ops(plain, bytes(3))])),
        (
            "ndarray called",
            h.set_pickle([h.glob("numpy", "ndarray") + h.lit(((1 << 40,), "f8")) + h.REDUCE]),
        ),
        (
            "reconstruct of a set",
            h.set_pickle(
                [
                    h.glob("numpy.core.multiarray", "_reconstruct")
                    + h.MARK
                    + h.glob("builtins", "set")
                    + h.lit((0,))
                    + h.lit(b"b")
                    + h.TUPLE
                    + h.REDUCE
                ]
            ),
        ),
    ]
    trees = []
    padded = 16
    good_levels = [h.plain_level_ops(level) for level in h.sum_tree_levels(np.ones(padded))]
    for label, dt in crafted_dtypes():
        trees.append(
            (
                label,
                h.sum_tree_pickle(
                    good_levels[:-1] + [h.array_ops((padded,), dt, bytes(8 * padded))]
                ),
            )
        )
    trees += [
        (
            "data shorter than shape",
            h.sum_tree_pickle(good_levels[:-1] + [h.array_ops((padded,), plain, bytes(8))]),
        ),
        (
            "data longer than shape",
            h.sum_tree_pickle(
                good_levels[:-1] + [h.array_ops((padded,), plain, bytes(8 * padded + 8))]
            ),
        ),
        (
            "huge shape",
            h.sum_tree_pickle(good_levels[:-1] + [h.array_ops((1 << 40, 1 << 40), plain, b"")]),
        ),
        ("missing level", h.sum_tree_pickle(good_levels[:-2] + good_levels[-1:])),
        (
            "big-endian ok shape lie",
            h.sum_tree_pickle(
                good_levels[:-1]
                + [h.array_ops((padded,), h.dtype_ops("f8", h.plain_dtype_state(">")), bytes(4))]
            ),
        ),
    ]
    run_isolated(
        """
    src, good, target = h.saved_and_target(prioritized, directory)
    for label, payload in ends:
      h.write(directory, "episode_end_indices", payload)
      refused(target, directory, h.path(directory, "episode_end_indices"), "")
    h.write(directory, "episode_end_indices", good["episode_end_indices"])
    if prioritized:
      for label, payload in trees:
        h.write(directory, "sum_tree", payload)
        refused(target, directory, h.path(directory, "sum_tree"), "")
      h.write(directory, "sum_tree", good["sum_tree"])
    target.load(directory, 0)  # the genuine files still load
    assert int(target.add_count) == int(src.add_count)
  """,
        prioritized=prioritized,
        directory=str(tmp_path),
        ends=ends,
        trees=trees if prioritized else [],
    )


def test_plain_pickles_built_by_hand_still_load(tmp_path):
    """The checked unpickler accepts numpy's own spelling (big-endian included)."""
    src = h.small_buffer(True)
    h.fill(src, 23)
    h.saved(src, tmp_path)
    leaves = src._core.get_priorities(np.arange(16, dtype=np.int64))  # pylint: disable=protected-access
    levels = h.sum_tree_levels(leaves)
    big = [
        h.array_ops(
            level.shape, h.dtype_ops("f8", h.plain_dtype_state(">")), level.astype(">f8").tobytes()
        )
        for level in levels
    ]
    h.write(
        tmp_path,
        "sum_tree",
        h.sum_tree_pickle(
            big, h.scalar_ops(h.dtype_ops("f8", h.plain_dtype_state()), np.float64(2.0).tobytes())
        ),
    )
    ends = sorted(src.episode_end_indices)
    h.write(
        tmp_path,
        "episode_end_indices",
        h.set_pickle(
            [
                h.scalar_ops(h.dtype_ops("i8", h.plain_dtype_state()), np.int64(e).tobytes())
                for e in ends
            ]
        ),
    )
    target = h.small_buffer(True, seed=3)
    target.load(str(tmp_path), 0)
    assert sorted(target.episode_end_indices) == ends
    np.testing.assert_array_equal(
        target._core.get_priorities(np.arange(16, dtype=np.int64)), leaves
    )  # pylint: disable=protected-access
    assert target._core.max_recorded_priority == 2.0  # pylint: disable=protected-access


# ---- 3. bombs and lying headers -------------------------------------------------------------------


@PRIORITIZED
def test_gzip_bomb_inflates_no_further_than_the_budget(tmp_path, prioritized):
    """A 256 MiB bomb in each pickled file: refused while peak RSS grows by less than 64 MiB."""
    run_isolated(
        """
    import resource
    src, good, target = h.saved_and_target(prioritized, directory)
    bomb = h.gzip_bomb(256 << 20)
    names = ["episode_end_indices"] + (["sum_tree"] if prioritized else [])
    for name in names:
      with open(h.path(directory, name), "wb") as f:
        f.write(bomb)
      base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
      refused(target, directory, h.path(directory, name), "inflates to more than")
      grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
      assert grown < 64 * 1024, "peak RSS grew by {} KiB".format(grown)
      h.write(directory, name, good[name])
    # A column with a true header and a bomb of trailing bytes: only its own bytes are read.
    column = good["$store$_observation"] + bytes(64 << 20)
    h.write(directory, "$store$_observation", column)
    target.load(directory, 0)
  """,
        prioritized=prioritized,
        directory=str(tmp_path),
    )


@PRIORITIZED
def test_npy_headers_that_lie_are_refused_before_allocating(tmp_path, prioritized):
    run_isolated(
        """
    src, good, target = h.saved_and_target(prioritized, directory)
    cases = [
        ("add_count", h.npy_header((1 << 40,)), "expected shape"),
        ("add_count", h.npy_header((1 << 20, 1 << 20)), "expected shape"),
        ("invalid_range", h.npy_header((1 << 40,)), "expected shape"),
        ("$store$_observation", h.npy_header((1 << 40, 3), "|u1"), "expected shape"),
        ("$store$_observation", h.npy_header((16, 3), "|u1"), "truncated"),
        ("$store$_reward", h.npy_header((16,), [("a", "<f4")]), "plain numeric"),
        ("$store$_reward", h.npy_header((16,), [("a", "<f4", (1000,))]), "plain numeric"),
        ("$store$_reward", h.npy_header((16,), "|V4"), "plain numeric"),
        ("$store$_action", h.npy_header((16,), "|O"), "plain numeric|object|allow_pickle"),
        ("invalid_range", h.npy((np.zeros(2, [("a", "<i8"), ("b", "<i8")]))), "plain numeric"),
    ]
    for name, payload, match in cases:
      h.write(directory, name, payload)
      refused(target, directory, h.path(directory, name), match)
      h.write(directory, name, good[name])
  """,
        prioritized=prioritized,
        directory=str(tmp_path),
    )


def test_checkpoint_error_is_a_value_error_and_a_protocol_error():
    from memoire import ProtocolError

    assert issubclass(CheckpointError, ValueError) and issubclass(CheckpointError, ProtocolError)
    assert issubclass(CapacityError, ValueError)


# ---- special files at a checkpoint file name ---------------------------------------------------


@PRIORITIZED
def test_fifo_or_symlink_at_a_checkpoint_file_name_is_refused_at_once(tmp_path, prioritized):
    # The buffer's own load, after any folder check would have passed: the open itself refuses.
    # A blocking open of the FIFO would hang the child; the timeout fails the test then.
    run_isolated(
        """
    import os, shutil
    src = h.small_buffer(prioritized)
    h.fill(src, 23)
    h.saved(src, directory)
    target = h.small_buffer(prioritized, seed=1)
    h.fill(target, 9, start=200)
    names = ["$store$_observation", "add_count", "episode_end_indices"]
    if prioritized:
      names.append("sum_tree")
    for name in names:
      path = h.path(directory, name)
      genuine = path + ".genuine"
      os.rename(path, genuine)
      os.mkfifo(path)  # nobody ever writes to it
      refused(target, directory, path, "not a regular file")
      os.remove(path)
      os.symlink(genuine, path)  # a symlink to the genuine file: still refused
      refused(target, directory, path, "symlink")
      os.remove(path)
      os.mkdir(path)
      refused(target, directory, path, "not a regular file")
      os.rmdir(path)
      os.rename(genuine, path)
    target.load(directory, 0)  # the genuine files load
    h.assert_same(h.snapshot(target), h.snapshot(src))
  """,
        timeout=120,
        prioritized=prioritized,
        directory=str(tmp_path),
    )


@pytest.mark.dopamine
def test_jax_fifo_or_symlink_at_the_checkpoint_file_is_refused_at_once(tmp_path):
    run_isolated(
        """
    import glob, os
    from memoire.dopamine_compat import jax_replay_buffer as jrb
    from memoire.dopamine_compat.checkpoint import CheckpointError

    def make(seed):
      acc = jrb.TransitionAccumulator(2, 1, 0.9)
      return jrb.ReplayBuffer(acc, jrb.UniformSamplingDistribution(seed), batch_size=4,
                              max_capacity=12)

    def fill(b, n, start=0):
      for k in range(start, start + n):
        b.add(jrb.TransitionElement(np.full((3,), k % 251, np.uint8), k % 2, float(k), k % 5 == 4))

    src = make(0)
    fill(src, 20)
    src.save(directory, 1)
    (path,) = glob.glob(os.path.join(directory, "1", "replay", "checkpoint.msgpack"))
    genuine = path + ".genuine"
    os.rename(path, genuine)
    target = make(1)
    fill(target, 9, start=200)
    before = (target.add_count, target.keys().tolist())
    for make_special, match in ((os.mkfifo, "not a regular file"),
                                (lambda p: os.symlink(genuine, p), "symlink")):
      make_special(path)
      with pytest.raises(CheckpointError, match=match) as info:
        target.load(directory, 1)
      assert "checkpoint.msgpack" in str(info.value), str(info.value)
      assert (target.add_count, target.keys().tolist()) == before
      os.remove(path)
    fill(target, 6, start=300)  # still adds and samples
    target.sample(4)
    os.rename(genuine, path)
    target.load(directory, 1)
    assert target.add_count == src.add_count and len(target) == len(src)
  """,
        timeout=120,
        directory=str(tmp_path),
    )


# ---- the JAX buffer --------------------------------------------------------------------------


@pytest.mark.dopamine
@pytest.mark.parametrize("compress", [True, False], ids=["compressed", "plain"])
def test_jax_tampered_checkpoint_is_refused(tmp_path, compress):
    run_isolated(
        """
    import glob, os
    import msgpack
    from dopamine.jax import serialization
    from memoire import CapacityError
    from memoire.dopamine_compat import jax_replay_buffer as jrb
    from memoire.dopamine_compat.checkpoint import CheckpointError

    def make(seed):
      acc = jrb.TransitionAccumulator(2, 1, 0.9)
      return jrb.ReplayBuffer(acc, jrb.UniformSamplingDistribution(seed), batch_size=4,
                              max_capacity=12, compress=compress)

    def fill(b, n, start=0):
      for k in range(start, start + n):
        b.add(jrb.TransitionElement(np.full((3,), k % 251, np.uint8), k % 2, float(k), k % 5 == 4))

    src = make(0)
    fill(src, 20)
    src.save(directory, 1)
    (path,) = glob.glob(os.path.join(directory, "1", "replay", "checkpoint.msgpack"))
    genuine = open(path, "rb").read()
    state = msgpack.unpackb(genuine, raw=False, strict_map_key=False)

    def tampered(change):
      s = msgpack.unpackb(genuine, raw=False, strict_map_key=False)
      change(s)
      with open(path, "wb") as f:
        f.write(msgpack.packb(s, use_bin_type=True))

    def snapshot(b):
      e = b.get_elements(b.keys()) if len(b) else None
      return (b.add_count, len(b), b.keys().tolist(),
              [np.asarray(getattr(e, f)).tolist() for f in jrb._ELEMENT_FIELDS] if e else [])

    for fresh in (False, True):
      target = make(1)
      if not fresh:
        fill(target, 9, start=200)
      cases = [
          ("add_count", lambda s: s.update(add_count={"integer": str(2**63 - 1)})),
          ("add_count", lambda s: s.update(add_count={"integer": str(2**64 + 3)})),
          ("add_count", lambda s: s.update(add_count={"integer": str(2**31 + 1)})),
          ("add_count", lambda s: s.update(add_count=-1)),
          ("integer", lambda s: s.update(add_count={"integer": "9" * 5000})),
          ("plain numeric|dtype", lambda s: s["memory"]["values"][0].__setitem__(
              1, {"dtype": repr([("a", "<i8")]), "shape": [], "data": bytes(8)})),
          ("plain numeric|dtype", lambda s: s["memory"]["values"][0].__setitem__(
              1, {"dtype": repr(("<i8", (10**6,))), "shape": [], "data": bytes(8)})),
          ("data bytes", lambda s: s["memory"]["values"][0].__setitem__(
              1, {"dtype": repr("<i8"), "shape": [1 << 40], "data": bytes(8)})),
          ("not a literal|dtype", lambda s: s["memory"]["values"][0].__setitem__(
              1, {"dtype": "__import__('os')", "shape": [], "data": bytes(8)})),
          ("key_by_index", lambda s: s["sampling_distribution"].update(key_by_index=[2**40] * 3)),
          ("keys", lambda s: s["sampling_distribution"].update(
              key_by_index=[2**40] * len(s["memory"]["keys"]))),
      ]
      if compress:
        def lie(s):  # the snappy stream of a stack claims 1 GiB
          record = serialization.decode(s["memory"]["values"][0][0]).copy()
          record["data"][:5] = [0x80, 0x80, 0x80, 0x80, 0x04]
          s["memory"]["values"][0][0] = serialization.encode(record)
        cases.append(("snappy", lie))
      for match, change in cases:
        tampered(change)
        before = snapshot(target)
        with pytest.raises(CheckpointError, match=match) as info:
          target.load(directory, 1)
        assert "checkpoint.msgpack" in str(info.value), str(info.value)
        assert snapshot(target) == before
        fill(target, 6, start=300)  # still adds and samples
        target.sample(4)
      with open(path, "wb") as f:
        f.write(genuine)
      target.load(directory, 1)
      assert target.add_count == src.add_count and len(target) == len(src)

    # At the counter limit (2**31: keys are int32): loads, then adds fail cleanly.
    tampered(lambda s: (s.update(add_count=2**31),
                        s["memory"].update(keys=list(range(2**31 - len(s["memory"]["keys"]),
                                                           2**31))),
                        s["sampling_distribution"].update(
                            key_by_index=[k + 2**31 - 20 for k in
                                          s["sampling_distribution"]["key_by_index"]])))
    target = make(2)
    target.load(directory, 1)
    assert target.add_count == 2**31
    before = snapshot(target)
    with pytest.raises(CapacityError, match="2\\\\*\\\\*31"):
      fill(target, 1)
    assert snapshot(target) == before
    target.sample(4)
  """,
        directory=str(tmp_path),
        compress=compress,
    )


# ---- a remotely hosted buffer -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["circular", "prioritized"])
def test_remote_load_of_tampered_folder_then_add_batch_keeps_the_server_alive(tmp_path, kind):
    run_isolated(
        """
    from memoire import CapacityError, ProtocolError
    from memoire.dopamine_compat import buffer_server, checkpoint, remote
    prioritized = kind == "prioritized"
    server, endpoint = buffer_server.start_buffer_server(
        kind, observation_shape=h.OBS_SHAPE, stack_size=h.STACK, replay_capacity=h.CAPACITY,
        batch_size=4, update_horizon=h.HORIZON, checkpoint_root=directory)
    try:
      proxy = remote.RemoteOutOfGraphReplayBuffer(endpoint, timeout=20.0)
      def fill(n, start):
        h.fill(proxy, n, start)
        proxy.flush()
      fill(23, 0)
      proxy.save(directory, 0)
      count = int(proxy.add_count)
      for bad in (2**63 - 1, 2**62 + 1):
        h.write(directory, "add_count", h.npy(np.array(bad, np.int64)))
        with pytest.raises(ProtocolError, match="add_count") as info:
          proxy.load(directory, 0)
        assert "add_count_ckpt.0.gz" in str(info.value)
        assert int(proxy.add_count) == count
        fill(7, 100)  # add_batch on the server
        count = int(proxy.add_count)
        proxy.sample_transition_batch(4)
      # A consistent folder at the limit loads; the next add_batch fails, the server stays.
      limit = 2**62 - 1
      h.write(directory, "add_count", h.npy(np.array(limit, np.int64)))
      local = h.small_buffer(prioritized)
      h.write(directory, "invalid_range", h.npy(checkpoint.buffer_invalid_range(local, limit)))
      proxy.load(directory, 0)
      assert int(proxy.add_count) == limit
      with pytest.raises(CapacityError):
        fill(3, 200)
      assert int(proxy.add_count) == limit
      proxy.sample_transition_batch(4)
      proxy.close()
    finally:
      server.close()
  """,
        kind=kind,
        directory=str(tmp_path),
    )


@pytest.mark.dopamine
def test_remote_jax_load_of_tampered_folder_then_adds_keep_the_server_alive(tmp_path):
    run_isolated(
        """
    import glob, os
    import msgpack
    from dopamine.jax.replay_memory import elements
    from memoire import CapacityError, ProtocolError
    from memoire.dopamine_compat import remote
    from memoire.dopamine_compat import buffer_server
    server, endpoint = buffer_server.start_buffer_server("jax", max_capacity=12, batch_size=4,
                                                  stack_size=2, seed=0,
                                                  checkpoint_root=directory)
    try:
      proxy = remote.RemoteReplayBuffer(endpoint, timeout=20.0)
      def fill(n, start):
        for k in range(start, start + n):
          proxy.add(elements.TransitionElement(np.full((3,), k % 251, np.uint8), k % 2,
                                               float(k), k % 5 == 4))
        proxy.flush()  # add_many (the bulk add) on the server
      fill(20, 0)
      proxy.save(directory, 1)
      (path,) = glob.glob(os.path.join(directory, "1", "replay", "checkpoint.msgpack"))
      genuine = msgpack.unpackb(open(path, "rb").read(), raw=False, strict_map_key=False)
      count = proxy.add_count
      for bad in ({"integer": str(2**63 - 1)}, {"integer": str(2**64)}, 2**31 + 7):
        state = dict(genuine, add_count=bad)
        with open(path, "wb") as f:
          f.write(msgpack.packb(state, use_bin_type=True))
        with pytest.raises(ProtocolError, match="add_count") as info:
          proxy.load(directory, 1)
        assert "checkpoint.msgpack" in str(info.value)
        assert proxy.add_count == count
        fill(6, 100)
        count = proxy.add_count
        proxy.sample(4)
      # At the limit (2**31): loads; the next bulk add fails; the server stays.
      shift = 2**31 - genuine["add_count"]
      state = dict(genuine, add_count=2**31)
      state["memory"] = dict(genuine["memory"], keys=[k + shift for k in genuine["memory"]["keys"]])
      dist = genuine["sampling_distribution"]
      state["sampling_distribution"] = dict(dist, key_by_index=[k + shift
                                                                for k in dist["key_by_index"]])
      with open(path, "wb") as f:
        f.write(msgpack.packb(state, use_bin_type=True))
      proxy.load(directory, 1)
      assert proxy.add_count == 2**31
      with pytest.raises(CapacityError):
        fill(3, 200)
      assert proxy.add_count == 2**31
      proxy.sample(4)
      proxy.close()
    finally:
      server.close()
  """,
        directory=str(tmp_path),
    )
