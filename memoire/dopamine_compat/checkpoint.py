"""Dopamine's replay checkpoint format (dopamine-rl 4.1.2), written atomically, read safely.

Layout (Dopamine's ``OutOfGraphReplayBuffer.save``): one gzip file per attribute,
``<checkpoint_dir>/<name>_ckpt.<iteration>.gz``, in this order:

- ``$store$_observation``, ``$store$_action``, ``$store$_reward``, ``$store$_terminal``, then
  ``$store$_<extra>``: ``np.save`` of the whole column ``[capacity, *shape]``;
- ``add_count``: ``np.save`` of a 0-d int64 array; ``invalid_range``: ``np.save`` of the array;
- ``episode_end_indices``: a pickled ``set`` of slot numbers;
- ``sum_tree`` (prioritized only): a pickled ``dopamine.tf.replay_memory.sum_tree.SumTree``
  (``nodes``: float64 levels of 1, 2, ..., P values; ``max_recorded_priority``).

Writing: the files go to temporary names in the same directory and are renamed only once all
are complete, so an interrupted save leaves the earlier checkpoints whole. The SumTree pickle
is composed opcode by opcode, so Dopamine is not imported. ``keep_every``: Dopamine returns
after the first file when it spares an iteration (so that checkpoint holds one file); memoire
does the same unless the buffer was built with ``fix_keep_every=True``.

Reading never unpickles arbitrary objects: arrays are read with ``allow_pickle=False`` after
their header's dtype and shape are checked; the two pickles are read by an unpickler that only
knows ``set``, numeric numpy arrays and scalars, and Dopamine's SumTree (as plain data). Every
file is read and checked before the buffer changes; any problem raises and changes nothing.
"""

import gzip
import io
import logging
import os
import pickle
import sys
import uuid
import zlib

import numpy as np

from memoire._core import ProtocolError

STORE_FILENAME_PREFIX = "$store$_"
_SLICE_BYTES = 1 << 20  # save and load pass a store column through slices of this size
_READ_BYTES = 4 << 20  # load decompresses this much per call (fewer calls: faster)
_COMPRESSLEVEL = 6  # zlib's default: Dopamine's level 9 costs much time for little space


def generate_filename(checkpoint_dir, name, suffix):
  return os.path.join(checkpoint_dir, "{}_ckpt.{}.gz".format(name, suffix))


def attribute_names(buffer):
  """Dopamine's checkpointable attributes of ``buffer``, in Dopamine's order."""
  names = [STORE_FILENAME_PREFIX + e.name for e in buffer.get_storage_signature()]
  names += ["add_count", "invalid_range", "episode_end_indices"]
  if buffer._PRIORITIZED:  # pylint: disable=protected-access
    names.append("sum_tree")
  return names


# ---- file systems: local (atomic rename) or tf.io.gfile for remote URLs --------------------


class _LocalFS(object):
  exists = staticmethod(os.path.exists)
  replace = staticmethod(os.replace)

  @staticmethod
  def open(path, mode):
    return open(path, mode)

  @staticmethod
  def remove(path):
    try:
      os.remove(path)
    except FileNotFoundError:
      pass

  @staticmethod
  def sync(f):
    f.flush()
    os.fsync(f.fileno())


class _GFileFS(object):
  """tf.io.gfile for paths such as gs://... (what Dopamine uses everywhere)."""

  def __init__(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self._gfile = tf.io.gfile
    self._not_found = tf.errors.NotFoundError

  def exists(self, path):
    return self._gfile.exists(path)

  def open(self, path, mode):
    return self._gfile.GFile(path, mode)

  def replace(self, src, dst):
    self._gfile.rename(src, dst, overwrite=True)

  def remove(self, path):
    try:
      self._gfile.remove(path)
    except self._not_found:
      pass

  @staticmethod
  def sync(f):
    f.flush()


def _fs(path):
  return _GFileFS() if "://" in str(path) else _LocalFS()


def _not_found(message):
  """Dopamine raises tf.errors.NotFoundError (agents catch it); without TF loaded, OSError."""
  tf = sys.modules.get("tensorflow")
  if tf is not None and hasattr(tf, "errors"):
    return tf.errors.NotFoundError(None, None, message)
  return FileNotFoundError(message)


# ---- writing ---------------------------------------------------------------------------------


class _Middle(object):
  """A write-only stream that passes on what is written to ``f`` except the first ``head``
  bytes and the last ``tail`` bytes."""

  def __init__(self, f, head, tail):
    self._f, self._skip, self._tail = f, head, tail
    self._held = b""  # the last `tail` bytes seen so far

  def write(self, data):
    view = memoryview(data).cast("B")
    n = len(view)
    if self._skip:
      cut = min(self._skip, len(view))
      view, self._skip = view[cut:], self._skip - cut
    if len(view) >= self._tail:
      self._f.write(self._held)
      self._f.write(view[:len(view) - self._tail])
      self._held = bytes(view[len(view) - self._tail:])
    else:
      joined = self._held + bytes(view)
      self._f.write(joined[:len(joined) - self._tail])
      self._held = joined[len(joined) - self._tail:]
    return n


def _write_sum_tree_pickle(f, leaves, max_recorded_priority):
  """Writes bytes that unpickle to Dopamine's SumTree holding ``leaves`` (float64[P]); the
  state dict is pickled straight into ``f`` (no copy of the whole pickle)."""
  levels = [np.asarray(leaves, np.float64)]
  while len(levels[0]) > 1:
    levels.insert(0, levels[0][0::2] + levels[0][1::2])
  # PROTO 3, GLOBAL SumTree, EMPTY_TUPLE, NEWOBJ, <state dict>, BUILD, STOP: the state dict is
  # a protocol-3 pickle less its PROTO (2 bytes) and STOP (1 byte).
  f.write(b"\x80\x03" + b"cdopamine.tf.replay_memory.sum_tree\nSumTree\n" + b")\x81")
  pickle.Pickler(_Middle(f, 2, 1), protocol=3).dump(
      {"nodes": levels, "max_recorded_priority": float(max_recorded_priority)})
  f.write(b"b.")


def _write_payload(gz, buffer, name):
  """Writes to ``gz`` the bytes (before gzip) Dopamine writes for attribute ``name``.

  A store column goes straight from the native storage into the gzip stream, in slices of
  _SLICE_BYTES, so saving holds no copy of the column.
  """
  if name.startswith(STORE_FILENAME_PREFIX):
    _write_npy(gz, buffer._store[name[len(STORE_FILENAME_PREFIX):]])  # pylint: disable=protected-access
  elif name == "sum_tree":
    core = buffer._core  # pylint: disable=protected-access
    leaves = core.get_priorities(np.arange(core.padded_leaves, dtype=np.int64))
    _write_sum_tree_pickle(gz, leaves, core.max_recorded_priority)
  else:
    gz.write(_payload(buffer, name))


def _write_npy(f, array):
  """Writes what ``np.save(f, array)`` writes (a version 1.0 header, then the C-order data)
  for a C-contiguous ``array``, passing the data by views of at most _SLICE_BYTES."""
  assert array.flags.c_contiguous
  np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
  data = memoryview(array.reshape(-1).view(np.uint8)) if array.nbytes else memoryview(b"")
  for start in range(0, len(data), _SLICE_BYTES):
    f.write(data[start:start + _SLICE_BYTES])


def _payload(buffer, name):
  """The bytes (before gzip) Dopamine writes for attribute ``name`` (not a store column)."""
  out = io.BytesIO()
  if name in ("add_count", "invalid_range"):
    np.save(out, getattr(buffer, name), allow_pickle=False)
  elif name == "episode_end_indices":
    pickle.dump(buffer.episode_end_indices, out)
  else:
    raise AssertionError(name)
  return out.getbuffer()


def save(buffer, checkpoint_dir, iteration_number):
  """Writes ``buffer``'s checkpoint for ``iteration_number`` (see the module docstring)."""
  fs = _fs(checkpoint_dir)
  if not fs.exists(checkpoint_dir):
    return
  names = attribute_names(buffer)
  stale = iteration_number - buffer._checkpoint_duration  # pylint: disable=protected-access
  keep_every = buffer._keep_every  # pylint: disable=protected-access
  spared = keep_every is not None and stale % keep_every == 0
  if spared and not buffer._fix_keep_every:  # pylint: disable=protected-access
    names = names[:1]  # Dopamine's early return inside its loop
  token = uuid.uuid4().hex[:12]
  written = []
  try:
    for name in names:
      final = generate_filename(checkpoint_dir, name, iteration_number)
      temp = "{}.tmp-{}".format(final, token)
      with fs.open(temp, "wb") as f:
        written.append((temp, final))
        with gzip.GzipFile(filename="", fileobj=f, mode="wb", compresslevel=_COMPRESSLEVEL,
                           mtime=0) as gz:
          _write_payload(gz, buffer, name)
        fs.sync(f)
    for temp, final in written:
      fs.replace(temp, final)
  except BaseException:
    for temp, _ in written:
      fs.remove(temp)
    raise
  if spared or stale < 0:
    return
  for name in attribute_names(buffer):
    fs.remove(generate_filename(checkpoint_dir, name, stale))


# ---- reading ---------------------------------------------------------------------------------


class PickledSumTree(object):
  """What a pickled Dopamine SumTree becomes: plain data, no methods run."""


def _checked_dtype(*args):
  dtype = np.dtype(*args)
  if dtype.hasobject:
    raise ProtocolError("checkpoint pickle holds an object array; refusing to load it")
  return dtype


try:
  from numpy.core.multiarray import _reconstruct as _np_reconstruct  # pylint: disable=g-import-not-at-top
except ImportError:  # numpy 2
  from numpy._core.multiarray import _reconstruct as _np_reconstruct  # pylint: disable=g-import-not-at-top


def _checked_reconstruct(subtype, shape, dtype):
  # The element dtype arrives later, in __setstate__, through _checked_dtype.
  if subtype is not np.ndarray:
    raise ProtocolError("checkpoint pickle holds an ndarray subclass; refusing to load it")
  return _np_reconstruct(np.ndarray, shape, dtype)


def _checked_scalar(dtype, data=None):
  if not isinstance(dtype, np.dtype) or dtype.hasobject or data is None:
    raise ProtocolError("checkpoint pickle holds a non-numeric numpy scalar")
  return np.frombuffer(data, dtype=dtype, count=1)[0]


def _checked_reconstructor(cls, base, state):
  if cls is not PickledSumTree or base is not object:
    raise ProtocolError("checkpoint pickle builds an unexpected object")
  return object.__new__(PickledSumTree)


_ALLOWED_GLOBALS = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _checked_dtype,
    ("numpy.core.multiarray", "_reconstruct"): _checked_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _checked_reconstruct,
    ("numpy.core.multiarray", "scalar"): _checked_scalar,
    ("numpy._core.multiarray", "scalar"): _checked_scalar,
    ("copyreg", "_reconstructor"): _checked_reconstructor,
    ("dopamine.tf.replay_memory.sum_tree", "SumTree"): PickledSumTree,
    ("dopamine.replay_memory.sum_tree", "SumTree"): PickledSumTree,
}


class _SafeUnpickler(pickle.Unpickler):
  """Resolves only the globals a Dopamine replay checkpoint needs."""

  def find_class(self, module, name):
    try:
      return _ALLOWED_GLOBALS[(module, name)]
    except KeyError:
      raise ProtocolError("checkpoint pickle refers to {}.{}, which memoire does not load".format(
          module, name)) from None


def safe_unpickle(data):
  return _SafeUnpickler(io.BytesIO(data)).load()


def _read_npy_header(f, filename, shape=None, dtype=None):
  """Reads and checks one .npy header (no object dtypes, and ``shape``/``dtype`` if given);
  returns (shape, fortran_order, dtype)."""
  version = np.lib.format.read_magic(f)
  if version == (1, 0):
    header = np.lib.format.read_array_header_1_0(f)
  elif version == (2, 0):
    header = np.lib.format.read_array_header_2_0(f)
  else:
    raise ProtocolError("{}: unsupported .npy version {}".format(filename, version))
  got_shape, fortran, got_dtype = header
  if got_dtype.hasobject:
    raise ProtocolError("{}: holds an object array; refusing to load it".format(filename))
  if shape is not None and tuple(got_shape) != tuple(shape):
    raise ProtocolError("{}: expected shape {}, got {}".format(filename, tuple(shape),
                                                             tuple(got_shape)))
  if dtype is not None:
    dtype = np.dtype(getattr(dtype, "as_numpy_dtype", dtype))  # TF DTypes from gin constants
    if got_dtype.newbyteorder("=") != dtype.newbyteorder("="):
      raise ProtocolError("{}: expected dtype {}, got {}".format(filename, dtype, got_dtype))
  return got_shape, fortran, got_dtype


def _read_exactly(f, view, filename, filled_before=0, total=None):
  """Fills memoryview ``view`` from ``f``; ProtocolError when the stream ends first."""
  filled = 0
  while filled < len(view):
    n = f.readinto(view[filled:])
    if not n:
      raise ProtocolError("{}: truncated ({} of {} data bytes)".format(
          filename, filled_before + filled, len(view) if total is None else total))
    filled += n


def _read_npy(f, filename, shape=None, dtype=None):
  """Reads one .npy stream; checks its header before reading data, and that the data is
  complete."""
  got_shape, fortran, got_dtype = _read_npy_header(f, filename, shape, dtype)
  array = np.empty(got_shape[::-1] if fortran else got_shape, dtype=got_dtype)
  if array.nbytes:
    _read_exactly(f, memoryview(array.reshape(-1).view(np.uint8)), filename)
  if fortran:
    array = array.T
  if not got_dtype.isnative:
    array = array.astype(got_dtype.newbyteorder("="))
  return array if array.flags.c_contiguous else array.copy(order="C")  # keeps 0-d arrays 0-d


def _read_npy_into(f, filename, out):
  """Reads one .npy stream into ``out`` (a C-contiguous array of the expected shape and dtype,
  reading zeros), checking it as _read_npy does.

  Data arrives in bounded pieces (_READ_BYTES); all-zero slices (_SLICE_BYTES) are skipped,
  so the pages of ``out`` they cover are never touched (an unfilled ring's zeros cost no
  memory).
  """
  got_shape, fortran, got_dtype = _read_npy_header(f, filename, out.shape, out.dtype)
  if fortran or not got_dtype.isnative:  # never written by Dopamine or memoire: read whole
    whole = np.empty(got_shape[::-1] if fortran else got_shape, dtype=got_dtype)
    if whole.nbytes:
      _read_exactly(f, memoryview(whole.reshape(-1).view(np.uint8)), filename)
    out[...] = whole.T if fortran else whole
    return
  dst = memoryview(out.reshape(-1).view(np.uint8)) if out.nbytes else memoryview(b"")
  scratch = memoryview(bytearray(min(_READ_BYTES, out.nbytes)))
  for start in range(0, out.nbytes, _READ_BYTES):
    piece = scratch[:min(_READ_BYTES, out.nbytes - start)]
    _read_exactly(f, piece, filename, start, out.nbytes)
    for at in range(0, len(piece), _SLICE_BYTES):
      part = piece[at:at + _SLICE_BYTES]
      if np.frombuffer(part, np.uint8).any():
        dst[start + at:start + at + len(part)] = part


def _read_file(fs, filename, reader):
  try:
    with fs.open(filename, "rb") as raw:
      with gzip.GzipFile(fileobj=raw, mode="rb") as f:
        return reader(f)
  except ProtocolError:
    raise
  except (OSError, EOFError, zlib.error, ValueError, pickle.UnpicklingError, TypeError,
          AttributeError, IndexError, KeyError) as e:
    raise ProtocolError("{}: not a readable checkpoint file ({}: {})".format(
        filename, type(e).__name__, e)) from e


def load(buffer, checkpoint_dir, suffix):
  """Restores ``buffer`` from the checkpoint ``suffix`` in ``checkpoint_dir`` (see module doc)."""
  fs = _fs(checkpoint_dir)
  names = attribute_names(buffer)
  skip_episode_ends = False
  for name in names:
    filename = generate_filename(checkpoint_dir, name, suffix)
    if not fs.exists(filename):
      if name == "episode_end_indices":
        logging.warning("Unable to find episode_end_indices. This is expected for old "
                        "checkpoints.")
        skip_episode_ends = True
        continue
      raise _not_found("Missing file: {}".format(filename))

  capacity = buffer._replay_capacity  # pylint: disable=protected-access
  core = buffer._core  # pylint: disable=protected-access
  # Columns stream into a staging buffer (no page taken for zeros); its pages move into the
  # buffer only once everything was read and checked.
  staging = buffer._make_core(seed=0)  # pylint: disable=protected-access
  for i, element in enumerate(buffer.get_storage_signature()):
    filename = generate_filename(checkpoint_dir, STORE_FILENAME_PREFIX + element.name, suffix)
    column = staging.column(i)
    _read_file(fs, filename, lambda f, fn=filename, c=column: _read_npy_into(f, fn, c))

  filename = generate_filename(checkpoint_dir, "add_count", suffix)
  add_count = _read_file(fs, filename, lambda f: _read_npy(f, filename))
  if add_count.shape != () or add_count.dtype.kind not in "iu" or int(add_count) < 0:
    raise ProtocolError("{}: expected a 0-d integer >= 0, got {} {}".format(
        filename, add_count.dtype, add_count.shape))
  add_count = int(add_count)

  filename = generate_filename(checkpoint_dir, "invalid_range", suffix)
  loaded_range = _read_file(fs, filename, lambda f: _read_npy(f, filename))
  if add_count == 0:
    expected = np.zeros((buffer._stack_size))  # pylint: disable=protected-access
  else:
    expected = buffer_invalid_range(buffer, add_count)
  if loaded_range.shape != expected.shape or not np.array_equal(loaded_range, expected):
    raise ProtocolError("{}: does not match add_count {} (expected {}, got {})".format(
        filename, add_count, expected.tolist(), loaded_range.tolist()))

  if skip_episode_ends:
    ends = sorted(buffer.episode_end_indices)
  else:
    filename = generate_filename(checkpoint_dir, "episode_end_indices", suffix)
    ends = _read_file(fs, filename, lambda f: safe_unpickle(f.read()))
    if not isinstance(ends, (set, frozenset)) or not all(
        isinstance(i, (int, np.integer)) and 0 <= i < capacity for i in ends):
      raise ProtocolError("{}: expected a set of slots in [0, {})".format(filename, capacity))
    ends = sorted(int(i) for i in ends)

  leaves, max_recorded = None, 1.0
  if buffer._PRIORITIZED:  # pylint: disable=protected-access
    filename = generate_filename(checkpoint_dir, "sum_tree", suffix)
    tree = _read_file(fs, filename, lambda f: safe_unpickle(f.read()))
    leaves, max_recorded = _check_sum_tree(tree, filename, capacity, core.padded_leaves)

  # Everything was read and checked: commit in one native call (which checks once more).
  core.restore_from(staging, add_count, ends, leaves, max_recorded)


def buffer_invalid_range(buffer, add_count):
  from memoire.dopamine_compat.circular_replay_buffer import invalid_range  # pylint: disable=g-import-not-at-top
  return invalid_range(add_count % buffer._replay_capacity, buffer._replay_capacity,  # pylint: disable=protected-access
                       buffer._stack_size, buffer._update_horizon)  # pylint: disable=protected-access


def _check_sum_tree(tree, filename, capacity, padded):
  if not isinstance(tree, PickledSumTree):
    raise ProtocolError("{}: expected a Dopamine SumTree".format(filename))
  nodes = getattr(tree, "nodes", None)
  max_recorded = getattr(tree, "max_recorded_priority", None)
  if not isinstance(nodes, list) or not nodes:
    raise ProtocolError("{}: SumTree.nodes is not a list of levels".format(filename))
  for depth, level in enumerate(nodes):
    if not isinstance(level, np.ndarray) or level.shape != (2**depth,) or level.dtype.kind != "f":
      raise ProtocolError("{}: SumTree level {} is not float[{}]".format(filename, depth,
                                                                       2**depth))
  leaves = np.asarray(nodes[-1], np.float64)
  if leaves.shape != (padded,):
    raise ProtocolError("{}: expected {} leaves for capacity {}, got {}".format(
        filename, padded, capacity, leaves.shape[0]))
  if not np.all(np.isfinite(leaves)) or np.any(leaves < 0):
    raise ProtocolError("{}: priorities must be finite and >= 0".format(filename))
  if np.any(leaves[capacity:] != 0):
    logging.warning("%s: ignoring priorities set past the capacity (%d)", filename, capacity)
  try:
    max_recorded = float(max_recorded)
  except (TypeError, ValueError):
    raise ProtocolError("{}: max_recorded_priority is not a number".format(filename)) from None
  if not np.isfinite(max_recorded):
    raise ProtocolError("{}: max_recorded_priority is not finite".format(filename))
  return np.ascontiguousarray(leaves[:capacity]), max_recorded
