"""Dopamine's replay checkpoint format (dopamine-rl 4.1.2), written atomically, read safely.

Layout (Dopamine's ``OutOfGraphReplayBuffer.save``): one gzip file per attribute,
``<checkpoint_dir>/<name>_ckpt.<iteration>.gz``, in this order:

- ``$store$_observation``, ``$store$_action``, ``$store$_reward``, ``$store$_terminal``, then
  ``$store$_<extra>``: ``np.save`` of the whole column ``[capacity, *shape]``;
- ``add_count``: ``np.save`` of a 0-d int64 array; ``invalid_range``: ``np.save`` of the array;
- ``episode_end_indices``: a pickled ``set`` of slot numbers;
- ``sum_tree`` (prioritized only): a pickled ``dopamine.tf.replay_memory.sum_tree.SumTree``
  (``nodes``: float64 levels of 1, 2, ..., P values; ``max_recorded_priority``);
- then every other public attribute of the buffer (a name in its ``__dict__`` not starting with
  ``_``, in assignment order), as Dopamine's ``_return_checkpointable_elements`` walks
  ``__dict__``: what a subclass or a caller sets is saved too, ``np.save`` for a numpy array, a
  pickle otherwise; ``load`` restores the attributes the loading buffer has (the same names), an
  array from a .npy file when its current value is an array, else from a pickle.

Writing: the files go to temporary names in the same directory and are renamed only once all
are complete, so an interrupted save leaves the earlier checkpoints whole. The SumTree pickle
is composed opcode by opcode, so Dopamine is not imported. ``keep_every``: Dopamine returns
after the first file when it spares an iteration (so that checkpoint holds one file); memoire
does the same unless the buffer was built with ``fix_keep_every=True``.

Reading treats every file as hostile (see :func:`load`): .npy files must have the exact shape
the constructor implies and a plain numeric dtype (no fields, offsets, subarrays or objects),
checked from the header before any data is read; the two pickles are inflated under a size
budget that the capacity implies and read by an unpickler that only knows ``set``, numpy arrays
and scalars, and Dopamine's SumTree (as plain data; :mod:`memoire.dopamine_compat.safe_pickle`,
which keeps numpy dtypes and arrays as inert records until they are checked). ``add_count`` must
lie in [0, 2**62] (the native core's bound). An added attribute's file is read only because the
loading buffer has that attribute (the folder's other files are never opened), and only as plain
data: a .npy file of a plain numeric dtype (any shape), or a pickle of None, bools, numbers,
strings, bytes, lists, tuples, dicts, sets and numpy scalars and arrays of plain dtypes (an
object of another class is refused: ``save`` warns when it writes one); either inflates to at
most the buffer's storage size (64 MiB when that is smaller). Every file is read and checked
before the buffer changes; any problem raises :class:`CheckpointError` naming the file and changes nothing. A
local file is opened by :func:`open_regular` (non-blocking, not following a symlink, fstat-ed):
a FIFO, device, folder or symlink at a checkpoint file name is refused at once.
"""

import gzip
import io
import logging
import os
import pickle
import sys
import tokenize
import uuid
import zlib

import numpy as np

from memoire.checkpoint_io import CheckpointError, open_regular  # noqa: F401 (re-exported)
from memoire.dopamine_compat._ring import STORE_FILENAME_PREFIX, invalid_range
from memoire.dopamine_compat.safe_pickle import (  # noqa: F401 (PickledSumTree re-exported)
    PickledSumTree,
    UnnamedError,
    check_plain_dtype,
    plain_data,
    resolve_array,
    safe_unpickle,
)

_SLICE_BYTES = 1 << 20  # save and load pass a store column through slices of this size
_READ_BYTES = 4 << 20  # load decompresses this much per call (fewer calls: faster)
_COMPRESSLEVEL = 6  # zlib's default: Dopamine's level 9 costs much time for little space
_ADDED_MIN_BUDGET = 64 << 20  # bytes an added attribute's file may always inflate to


def generate_filename(checkpoint_dir, name, suffix):
    return os.path.join(checkpoint_dir, "{}_ckpt.{}.gz".format(name, suffix))


# Dopamine's own checkpointed attributes; memoire serves them from the native object (properties,
# or the sum tree view), so they are written by name rather than from ``__dict__``.
_OWN_ATTRIBUTES = ("add_count", "invalid_range", "episode_end_indices", "sum_tree")


def attribute_names(buffer):
    """Dopamine's checkpointable attributes of ``buffer``, in Dopamine's order: the store
    columns, add_count, invalid_range, episode_end_indices, sum_tree (prioritized only), then
    :func:`added_attribute_names`."""
    names = [STORE_FILENAME_PREFIX + e.name for e in buffer.get_storage_signature()]
    names += ["add_count", "invalid_range", "episode_end_indices"]
    if buffer._PRIORITIZED:  # pylint: disable=protected-access
        names.append("sum_tree")
    return names + added_attribute_names(buffer)


def added_attribute_names(buffer):
    """The public attributes of ``buffer`` beyond Dopamine's own: names in its ``__dict__`` that
    do not start with ``_``, in assignment order (what a subclass or a caller set).

    Raises:
      ValueError: such a name is not a Python identifier (it would name a file elsewhere).
    """
    names = []
    for name in list(vars(buffer)):
        if name.startswith("_") or name in _OWN_ATTRIBUTES:
            continue
        if not (isinstance(name, str) and name.isidentifier()):
            raise ValueError(
                "{} attribute {!r}: expected an identifier to name its checkpoint file".format(
                    type(buffer).__name__, name
                )
            )
        names.append(name)
    return names


def added_attribute_budget(buffer):
    """Bytes an added attribute's file may inflate to: the buffer's storage size, at least
    64 MiB (an attribute larger than the ring it describes is not one this buffer wrote)."""
    stored = sum(column.nbytes for column in buffer._store.values())  # pylint: disable=protected-access
    return max(stored, _ADDED_MIN_BUDGET)


# ---- file systems: local (atomic rename) or tf.io.gfile for remote URLs --------------------


class _LocalFS(object):
    exists = staticmethod(os.path.exists)
    replace = staticmethod(os.replace)

    @staticmethod
    def open_read(path):
        return open_regular(path)

    @staticmethod
    def create(path):
        return open(path, "xb")  # exclusive: never follows a symlink or opens a FIFO at `path`

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

    def open_read(self, path):
        return self._gfile.GFile(path, "rb")

    def create(self, path):
        return self._gfile.GFile(path, "wb")

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
            self._f.write(view[: len(view) - self._tail])
            self._held = bytes(view[len(view) - self._tail :])
        else:
            joined = self._held + bytes(view)
            self._f.write(joined[: len(joined) - self._tail])
            self._held = joined[len(joined) - self._tail :]
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
        {"nodes": levels, "max_recorded_priority": float(max_recorded_priority)}
    )
    f.write(b"b.")


def _write_payload(gz, buffer, name):
    """Writes to ``gz`` the bytes (before gzip) Dopamine writes for attribute ``name``.

    A store column goes straight from the native storage into the gzip stream, in slices of
    _SLICE_BYTES, so saving holds no copy of the column.
    """
    if name.startswith(STORE_FILENAME_PREFIX):
        _write_npy(gz, buffer._store[name[len(STORE_FILENAME_PREFIX) :]])  # pylint: disable=protected-access
    elif name == "sum_tree":
        core = buffer._core  # pylint: disable=protected-access
        leaves = core.get_priorities(np.arange(core.padded_leaves, dtype=np.int64))
        _write_sum_tree_pickle(gz, leaves, core.max_recorded_priority)
    elif name in _OWN_ATTRIBUTES:
        gz.write(_payload(buffer, name))
    else:
        _write_added(gz, buffer, name)


def _write_added(gz, buffer, name):
    """Writes an added public attribute as Dopamine does: ``np.save`` for an array, else a
    pickle (warning when memoire's load would refuse the pickle: not plain data)."""
    value = vars(buffer)[name]
    if isinstance(value, np.ndarray):
        np.save(gz, value, allow_pickle=False)
        return
    data = pickle.dumps(value)
    try:
        plain_data(safe_unpickle(data), name)
    except Exception as e:  # pylint: disable=broad-except (only a warning: Dopamine loads it)
        logging.warning(
            "%s.%s is saved, but memoire's load will refuse it (%s): keep plain data "
            "(numbers, strings, lists, dicts, numpy arrays) in a buffer's public attributes",
            type(buffer).__name__,
            name,
            e,
        )
    gz.write(data)


def _write_npy(f, array):
    """Writes what ``np.save(f, array)`` writes (a version 1.0 header, then the C-order data)
    for a C-contiguous ``array``, passing the data by views of at most _SLICE_BYTES."""
    assert array.flags.c_contiguous
    np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
    data = memoryview(array.reshape(-1).view(np.uint8)) if array.nbytes else memoryview(b"")
    for start in range(0, len(data), _SLICE_BYTES):
        f.write(data[start : start + _SLICE_BYTES])


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
            with fs.create(temp) as f:
                written.append((temp, final))
                with gzip.GzipFile(
                    filename="", fileobj=f, mode="wb", compresslevel=_COMPRESSLEVEL, mtime=0
                ) as gz:
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

_BUDGET_SLACK = 1 << 16  # bytes of pickle framing allowed on top of a payload's own size


def _read_limited(f, budget, filename):
    """All the (inflated) bytes of ``f``; CheckpointError when there are more than ``budget``,
    having inflated at most budget + 1 of them (a gzip bomb stops there)."""
    data = f.read(budget + 1)
    if len(data) > budget:
        raise CheckpointError(
            "{}: inflates to more than {} bytes, more than a checkpoint of this "
            "buffer can hold".format(filename, budget)
        )
    return data


def _read_npy_header(f, filename, shape, dtype=None, budget=None):
    """Reads and checks one .npy header: a plain numeric dtype, exactly ``shape`` (any shape
    for None, then at most ``budget`` data bytes), and ``dtype`` if given. Returns (shape,
    fortran_order, dtype)."""
    version = np.lib.format.read_magic(f)
    try:
        if version == (1, 0):
            header = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            header = np.lib.format.read_array_header_2_0(f)
        else:
            raise CheckpointError("{}: unsupported .npy version {}".format(filename, version))
    except (SyntaxError, tokenize.TokenError) as e:  # numpy parses the header as Python source
        raise CheckpointError("{}: bad .npy header ({})".format(filename, e)) from None
    got_shape, fortran, got_dtype = header
    check_plain_dtype(got_dtype, filename)
    if shape is None:
        nbytes = got_dtype.itemsize
        for d in got_shape:
            nbytes *= d
        if nbytes > budget:
            raise CheckpointError(
                "{}: an array of {} bytes, more than a checkpoint of this buffer can hold "
                "({})".format(filename, nbytes, budget)
            )
    elif tuple(got_shape) != tuple(shape):
        raise CheckpointError(
            "{}: expected shape {}, got {}".format(filename, tuple(shape), tuple(got_shape))
        )
    if dtype is not None:
        dtype = np.dtype(getattr(dtype, "as_numpy_dtype", dtype))  # TF DTypes from gin constants
        if got_dtype.newbyteorder("=") != dtype.newbyteorder("="):
            raise CheckpointError(
                "{}: expected dtype {}, got {}".format(filename, dtype, got_dtype)
            )
    return got_shape, fortran, got_dtype


def _read_exactly(f, view, filename, filled_before=0, total=None):
    """Fills memoryview ``view`` from ``f``; CheckpointError when the stream ends first."""
    filled = 0
    while filled < len(view):
        n = f.readinto(view[filled:])
        if not n:
            raise CheckpointError(
                "{}: truncated ({} of {} data bytes)".format(
                    filename, filled_before + filled, len(view) if total is None else total
                )
            )
        filled += n


def _read_npy(f, filename, shape, dtype=None, budget=None):
    """Reads one .npy stream; checks its header before reading data (shape None: any shape of
    at most ``budget`` bytes), and that the data is complete."""
    got_shape, fortran, got_dtype = _read_npy_header(f, filename, shape, dtype, budget)
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
        piece = scratch[: min(_READ_BYTES, out.nbytes - start)]
        _read_exactly(f, piece, filename, start, out.nbytes)
        for at in range(0, len(piece), _SLICE_BYTES):
            part = piece[at : at + _SLICE_BYTES]
            if np.frombuffer(part, np.uint8).any():
                dst[start + at : start + at + len(part)] = part


def _read_file(fs, filename, reader):
    """``reader(inflating stream)``, with every failure turned into CheckpointError."""
    try:
        with fs.open_read(filename) as raw:
            with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                return reader(f)
    except UnnamedError as e:
        raise CheckpointError("{}: {}".format(filename, e)) from None
    except CheckpointError:
        raise
    except (
        OSError,
        EOFError,
        zlib.error,
        ValueError,
        pickle.UnpicklingError,
        TypeError,
        AttributeError,
        IndexError,
        KeyError,
        OverflowError,
        MemoryError,  # a pickle that declares more bytes than memory holds
    ) as e:
        raise CheckpointError(
            "{}: not a readable checkpoint file ({}: {})".format(filename, type(e).__name__, e)
        ) from e


def load(buffer, checkpoint_dir, suffix):
    """Restores ``buffer`` from the checkpoint ``suffix`` in ``checkpoint_dir`` (see module doc).

    Every file is read and checked against what this buffer's constructor implies before the
    buffer changes: columns of exactly [capacity, *shape] and the element's dtype, add_count a
    0-d integer in [0, 2**62], invalid_range what add_count implies, episode ends a set of slots
    in [0, capacity), the SumTree's levels float[1], float[2], ... float[P]. Pickles inflate to
    at most a budget that the capacity implies (plus 64 KiB), .npy files to their header and
    the shape's bytes; nothing inflates past that.

    Raises:
      tensorflow.errors.NotFoundError (FileNotFoundError without TensorFlow): a file is missing.
      CheckpointError (a ValueError): anything else wrong; the buffer is unchanged.
    """
    fs = _fs(checkpoint_dir)
    names = attribute_names(buffer)
    skip_episode_ends = False
    for name in names:
        filename = generate_filename(checkpoint_dir, name, suffix)
        if not fs.exists(filename):
            if name == "episode_end_indices":
                logging.warning(
                    "Unable to find episode_end_indices. This is expected for old checkpoints."
                )
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
    add_count = _read_file(fs, filename, lambda f: _read_npy(f, filename, ()))
    limit = core.MAX_ADD_COUNT
    if add_count.dtype.kind not in "iu" or not 0 <= int(add_count) <= limit:
        raise CheckpointError(
            "{}: expected a 0-d integer in [0, 2**62], got {} {}".format(
                filename, add_count.dtype, add_count.tolist()
            )
        )
    add_count = int(add_count)

    filename = generate_filename(checkpoint_dir, "invalid_range", suffix)
    if add_count == 0:
        expected = np.zeros((buffer._stack_size))  # pylint: disable=protected-access
    else:
        expected = buffer_invalid_range(buffer, add_count)
    loaded_range = _read_file(fs, filename, lambda f: _read_npy(f, filename, expected.shape))
    if not np.array_equal(loaded_range, expected):
        raise CheckpointError(
            "{}: does not match add_count {} (expected {}, got {})".format(
                filename, add_count, expected.tolist(), loaded_range.tolist()
            )
        )

    if skip_episode_ends:
        ends = sorted(buffer.episode_end_indices)
    else:
        filename = generate_filename(checkpoint_dir, "episode_end_indices", suffix)
        # Dopamine pickles a set of numpy int64 scalars: about 25 bytes each (protocol 2 and up),
        # up to about 70 in protocol 0's text.
        budget = 128 * capacity + _BUDGET_SLACK
        ends = _read_file(fs, filename, lambda f: safe_unpickle(_read_limited(f, budget, filename)))
        if not isinstance(ends, (set, frozenset)) or not all(
            isinstance(i, (int, np.integer))
            and not isinstance(i, (bool, np.bool_))
            and 0 <= i < capacity
            for i in ends
        ):
            raise CheckpointError(
                "{}: expected a set of slots in [0, {})".format(filename, capacity)
            )
        ends = sorted(int(i) for i in ends)

    leaves, max_recorded = None, 1.0
    if buffer._PRIORITIZED:  # pylint: disable=protected-access
        filename = generate_filename(checkpoint_dir, "sum_tree", suffix)
        padded = core.padded_leaves
        # 2P - 1 float64 nodes (16P bytes) and some framing per level; twice that, for pickles
        # written otherwise (Dopamine's own are 16P + about 100 bytes per level).
        budget = 32 * padded + _BUDGET_SLACK
        leaves, max_recorded = _read_file(
            fs,
            filename,
            lambda f: _check_sum_tree(
                safe_unpickle(_read_limited(f, budget, filename)), filename, capacity, padded
            ),
        )

    added = {}
    budget = added_attribute_budget(buffer)
    for name in added_attribute_names(buffer):
        filename = generate_filename(checkpoint_dir, name, suffix)
        if isinstance(vars(buffer)[name], np.ndarray):  # Dopamine's rule: the current value's type
            reader = lambda f, fn=filename: _read_npy(f, fn, None, budget=budget)  # noqa: E731
        else:
            reader = lambda f, fn=filename: plain_data(  # noqa: E731
                safe_unpickle(_read_limited(f, budget, fn)), fn
            )
        added[name] = _read_file(fs, filename, reader)

    # Everything was read and checked: commit in one native call (which checks once more).
    core.restore_from(staging, add_count, ends, leaves, max_recorded)
    vars(buffer).update(added)


def buffer_invalid_range(buffer, add_count):
    return invalid_range(
        add_count % buffer._replay_capacity,
        buffer._replay_capacity,  # pylint: disable=protected-access
        buffer._stack_size,
        buffer._update_horizon,
    )  # pylint: disable=protected-access


def _check_sum_tree(tree, filename, capacity, padded):
    """(leaves float64[capacity], max_recorded_priority) of an unpickled Dopamine SumTree whose
    levels are float[1], float[2], ..., float[padded]."""
    if not isinstance(tree, PickledSumTree):
        raise CheckpointError("{}: expected a Dopamine SumTree".format(filename))
    nodes = getattr(tree, "nodes", None)
    max_recorded = getattr(tree, "max_recorded_priority", None)
    if not isinstance(nodes, list) or not nodes:
        raise CheckpointError("{}: SumTree.nodes is not a list of levels".format(filename))
    if 2 ** (len(nodes) - 1) != padded:
        raise CheckpointError(
            "{}: expected {} levels ({} leaves for capacity {}), got {}".format(
                filename, padded.bit_length(), padded, capacity, len(nodes)
            )
        )
    levels = [
        resolve_array(level, "{}: SumTree level {}".format(filename, depth))
        for depth, level in enumerate(nodes)
    ]
    for depth, level in enumerate(levels):
        if level.shape != (2**depth,) or level.dtype.kind != "f":
            raise CheckpointError(
                "{}: SumTree level {} is not float[{}]".format(filename, depth, 2**depth)
            )
    leaves = levels[-1].astype(np.float64)
    if not np.all(np.isfinite(leaves)) or np.any(leaves < 0):
        raise CheckpointError("{}: priorities must be finite and >= 0".format(filename))
    if np.any(leaves[capacity:] != 0):
        logging.warning("%s: ignoring priorities set past the capacity (%d)", filename, capacity)
    if isinstance(max_recorded, (bool, np.bool_)) or not isinstance(
        max_recorded, (int, float, np.integer, np.floating)
    ):
        raise CheckpointError("{}: max_recorded_priority is not a number".format(filename))
    max_recorded = float(max_recorded)
    if not np.isfinite(max_recorded):
        raise CheckpointError("{}: max_recorded_priority is not finite".format(filename))
    return np.ascontiguousarray(leaves[:capacity]), max_recorded
