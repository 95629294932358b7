"""The pickles of Dopamine's replay checkpoints, read without running anything they name.

Dopamine's TF-era checkpoints (:mod:`memoire.dopamine_compat.checkpoint`) pickle a set of
episode ends, its SumTree, and whatever public attributes a buffer holds. Unpickling runs the
constructors a pickle names, so these are read by an unpickler that only knows ``set``, numpy
arrays and scalars, and Dopamine's SumTree (as plain data, :class:`PickledSumTree`). numpy
dtypes and arrays are kept as inert records and rebuilt only as plain numeric dtypes with
exactly their bytes (numpy's own ``dtype.__setstate__`` would trust a crafted field offset or
subarray). :func:`plain_data` then accepts only plain data: None, bools, numbers, strings,
bytes, numpy scalars and arrays, and lists, tuples, dicts and sets of them.
"""

import io
import pickle

import numpy as np

from memoire.checkpoint_io import CheckpointError

_PLAIN_KINDS = "biuf"  # bool, signed and unsigned integers, floats


class UnnamedError(CheckpointError):
    """A CheckpointError raised where the file is not known (while unpickling bytes):
    _read_file names the file."""


def check_plain_dtype(dtype, filename, error=CheckpointError):
    """Raises ``error`` unless ``dtype`` is a plain numeric dtype: no fields, offsets, subarrays,
    objects. ``filename`` starts the message (UnnamedError's callers pass what they read)."""
    if dtype.kind not in _PLAIN_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise error(
            "{}: expected a plain numeric dtype (bool, int, uint or float), got {}".format(
                filename, dtype
            )
        )


class PickledSumTree(object):
    """What a pickled Dopamine SumTree becomes: plain data, no methods run."""


class _PickledDType(object):
    """A dtype as a pickle spells it: ``numpy.dtype``'s arguments, then (BUILD) its state.

    Never a numpy dtype: numpy's ``dtype.__setstate__`` trusts its state (field offsets, item
    size, subarrays), so a crafted one makes arrays that read outside their memory. Only
    :func:`_resolve_dtype` turns this into a dtype, and only into a plain numeric one.
    """

    __slots__ = ("args", "state")

    def __init__(self, args):
        self.args = args
        self.state = None

    def __setstate__(self, state):
        self.state = state


class _PickledArray(object):
    """An ndarray as a pickle spells it (``_reconstruct`` then BUILD with numpy's array state);
    made into an array only by :func:`resolve_array`, after checking dtype, shape and size."""

    __slots__ = ("state",)

    def __init__(self):
        self.state = None

    def __setstate__(self, state):
        self.state = state


_NDARRAY = object()  # what the global numpy.ndarray resolves to: valid only inside _reconstruct


def _pickled_dtype(*args):
    return _PickledDType(args)


def _pickled_reconstruct(subtype, shape, dtype):
    del shape, dtype  # numpy's placeholder; the real ones arrive in the state (BUILD)
    if subtype is not _NDARRAY:
        raise UnnamedError("checkpoint pickle reconstructs something other than numpy.ndarray")
    return _PickledArray()


def _resolve_dtype(spelled):
    """The plain numeric numpy dtype a :class:`_PickledDType` spells, else CheckpointError."""
    if not isinstance(spelled, _PickledDType):
        raise UnnamedError(
            "checkpoint pickle: expected a numpy dtype, got {}".format(type(spelled).__name__)
        )
    args, state = spelled.args, spelled.state
    if not 1 <= len(args) <= 3 or not isinstance(args[0], str) or len(args[0]) > 8:
        raise UnnamedError(
            "checkpoint pickle: expected a numeric dtype code such as 'f8', got dtype{!r}".format(
                args[:1]
            )
        )
    try:
        dtype = np.dtype(args[0])
    except TypeError:
        raise UnnamedError("checkpoint pickle: unknown dtype {!r}".format(args[0])) from None
    check_plain_dtype(dtype, "checkpoint pickle", UnnamedError)
    if state is not None:
        # numpy's dtype state: (version, byte order, subarray, names, fields, item size, alignment,
        # flags[, metadata]); for a plain dtype only the byte order may vary.
        if (
            not isinstance(state, tuple)
            or len(state) not in (8, 9)
            or state[1] not in ("<", ">", "|", "=")
            or any(s is not None for s in state[2:5])
            or state[5] not in (-1, dtype.itemsize)
        ):
            raise UnnamedError(
                "checkpoint pickle: dtype {} with a state other than a plain "
                "numeric dtype's (fields, offsets or subarrays)".format(dtype)
            )
        if state[1] in "<>":
            dtype = dtype.newbyteorder(state[1])
    return dtype


def resolve_array(spelled, what):
    """The native-order C-contiguous array a :class:`_PickledArray` spells, after checking its
    dtype (plain numeric), shape and that its data holds exactly shape x itemsize bytes."""
    if not isinstance(spelled, _PickledArray) or not isinstance(spelled.state, tuple):
        raise CheckpointError("{}: expected a numpy array".format(what))
    state = spelled.state
    if len(state) == 4:
        state = (1,) + state
    if len(state) != 5 or state[0] != 1:
        raise CheckpointError(
            "{}: expected numpy's array state (1, shape, dtype, fortran, data)".format(what)
        )
    _, shape, dtype, fortran, data = state
    dtype = _resolve_dtype(dtype)
    if (
        not isinstance(shape, tuple)
        or len(shape) > 32
        or not all(type(d) is int and d >= 0 for d in shape)
    ):  # pylint: disable=unidiomatic-typecheck
        raise CheckpointError("{}: bad array shape {!r}".format(what, shape))
    if not isinstance(fortran, bool) or not isinstance(data, (bytes, bytearray)):
        raise CheckpointError("{}: expected an array's raw bytes".format(what))
    size = 1
    for d in shape:
        size *= d
    if len(data) != size * dtype.itemsize:
        raise CheckpointError(
            "{}: array {}{} needs {} data bytes, the pickle holds {}".format(
                what, dtype, list(shape), size * dtype.itemsize, len(data)
            )
        )
    array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    return np.ascontiguousarray(array, dtype=dtype.newbyteorder("="))


def _pickled_scalar(dtype, data=None):
    dtype = _resolve_dtype(dtype)
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise UnnamedError(
            "checkpoint pickle: a numpy {} scalar needs {} bytes".format(dtype, dtype.itemsize)
        )
    return np.frombuffer(data, dtype=dtype)[0]


def _pickled_reconstructor(cls, base, state):
    if cls is not PickledSumTree or base is not object or state is not None:
        raise UnnamedError("checkpoint pickle builds an unexpected object")
    return object.__new__(PickledSumTree)


# Every global a Dopamine replay checkpoint's pickles name, and what each becomes here: numpy's
# are spelled out as inert records (see _PickledDType) and checked when read.
_ALLOWED_GLOBALS = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _pickled_dtype,
    ("numpy.core.multiarray", "_reconstruct"): _pickled_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _pickled_reconstruct,
    ("numpy.core.multiarray", "scalar"): _pickled_scalar,
    ("numpy._core.multiarray", "scalar"): _pickled_scalar,
    ("copyreg", "_reconstructor"): _pickled_reconstructor,
    ("dopamine.tf.replay_memory.sum_tree", "SumTree"): PickledSumTree,
    ("dopamine.replay_memory.sum_tree", "SumTree"): PickledSumTree,
}


class _SafeUnpickler(pickle.Unpickler):
    """Resolves only the globals a Dopamine replay checkpoint needs."""

    def find_class(self, module, name):
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise UnnamedError(
                "checkpoint pickle refers to {}.{}, which memoire does not load".format(
                    module, name
                )
            ) from None


def safe_unpickle(data):
    """Unpickles ``data`` with only the globals above: sets, ints, floats, lists, dicts, numpy
    scalars of plain dtypes, :class:`PickledSumTree` and inert array records (resolve those with
    :func:`resolve_array`)."""
    return _SafeUnpickler(io.BytesIO(data)).load()


_PLAIN_ATOMS = (type(None), bool, int, float, complex, str, bytes, np.generic)
_MAX_NESTING = 100  # containers within containers a plain-data pickle may hold
_IN_PROGRESS = object()


def plain_data(value, what):
    """``value`` (from :func:`safe_unpickle`) with its inert numpy records made into arrays and
    dtypes, when it is plain data: None, bools, numbers, strings, bytes, numpy scalars, and
    lists, tuples, dicts, sets and frozensets of them, nested at most _MAX_NESTING deep.

    Raises:
      CheckpointError: anything else (an object of another class, a SumTree, a type, a container
        holding itself); ``what`` starts the message.
    """
    done = {}  # id -> resolved, so shared sub-objects are walked once

    def walk(v, depth):
        if isinstance(v, _PLAIN_ATOMS) and not isinstance(v, np.object_):
            return v
        if depth > _MAX_NESTING:
            raise CheckpointError("{}: nested deeper than {}".format(what, _MAX_NESTING))
        key = id(v)
        if key in done:
            if done[key] is _IN_PROGRESS:
                raise CheckpointError("{}: a container holds itself".format(what))
            return done[key]
        done[key] = _IN_PROGRESS
        kind = type(v)
        if kind is _PickledArray:
            out = resolve_array(v, what)
        elif kind is _PickledDType:
            out = _resolve_dtype(v)
        elif kind in (list, tuple):
            out = kind(walk(x, depth + 1) for x in v)
        elif kind in (set, frozenset):
            out = kind(walk(x, depth + 1) for x in v)  # unhashable items: TypeError
        elif kind is dict:
            out = {walk(k, depth + 1): walk(x, depth + 1) for k, x in v.items()}
        else:
            raise CheckpointError(
                "{}: expected plain data (numbers, strings, lists, dicts, sets, numpy arrays), "
                "got {}".format(what, "a type" if isinstance(v, type) else kind.__name__)
            )
        done[key] = out
        return out

    return walk(value, 0)
