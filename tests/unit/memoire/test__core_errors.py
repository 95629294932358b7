"""The native core's errors reach Python as one exception type per status code, with the data
a caller acts on as attributes (no caller parses a message): KeyError(key) for a key not
stored, IndexError with index and bound, ValueError and RuntimeError with named counts."""

import numpy as np
import pytest

from memoire import _core


def _store(prioritized=False):
    return _core.TransitionStore(
        max_capacity=4,
        stack_size=1,
        update_horizon=1,
        gamma=0.9,
        fix_terminal_duplicates=False,
        prioritized=prioritized,
        tree_capacity=4,
        frame_bytes=2,
        elem_bytes=1,
        action_bytes=1,
    )


def _add_steps(store, n):
    for i in range(n):
        store.add(np.full(2, i, np.uint8), np.zeros(1, np.uint8), 1.0, False, False, 1.0)


def _buffer(prioritized=False, capacity=8):
    fields = [
        ("observation", np.uint8, (2,)),
        ("action", np.int32, ()),
        ("reward", np.float32, ()),
        ("terminal", np.uint8, ()),
    ]
    return _core.CircularBuffer(
        fields,
        capacity=capacity,
        stack_size=1,
        update_horizon=1,
        gamma=0.9,
        max_sample_attempts=10,
        prioritized=prioritized,
        episode_end_breaks_stacks=False,
        seed=1,
    )


def _outputs(buf, n):
    state = np.zeros((n, 2, 1), np.uint8)
    outs = [
        state,
        np.zeros(n, np.int32),
        np.zeros(n, np.float32),
        state.copy(),
        np.zeros(n, np.int32),
        np.zeros(n, np.float32),
        np.zeros(n, np.uint8),
        np.zeros(n, np.int32),
    ]
    return outs


@pytest.mark.parametrize("call", ["gather", "priorities", "update"])
def test_transition_store_missing_key_is_key_error_of_the_key(call):
    store = _store(prioritized=True)
    _add_steps(store, 6)  # keys 0..4 emitted, 0 evicted: 1..4 stored
    keys = np.array([2, 0], np.int64)
    out = (
        np.zeros((2, 2, 1), np.uint8),
        np.zeros((2, 1), np.uint8),
        np.zeros(2),
        np.zeros((2, 2, 1), np.uint8),
        np.zeros(2, np.bool_),
        np.zeros(2, np.bool_),
    )
    before = store.priorities(np.array([2], np.int64))
    with pytest.raises(KeyError) as e:
        if call == "gather":
            store.gather(keys, *out)
        elif call == "priorities":
            store.priorities(keys)
        else:
            store.update(keys, np.array([5.0, 5.0]))
    assert e.value.args == (0,) and e.value.key == 0
    assert store.priorities(np.array([2], np.int64)) == before  # a failed update set nothing


def test_transition_store_bad_dense_index_is_index_error_with_bound():
    store = _store()
    _add_steps(store, 3)
    with pytest.raises(IndexError) as e:
        store.keys_at(np.array([0, 7], np.int64))
    assert (e.value.index, e.value.bound) == (7, store.size)


def test_circular_buffer_gather_errors_carry_slot_or_index_and_bound():
    buf = _buffer()
    for i in range(3):
        buf.add(np.array([i, i], np.uint8), 0, 1.0, False, (), None, False)
    with pytest.raises(KeyError) as e:  # slot 5's range has not been written
        buf.gather(np.array([5], np.int64), _outputs(buf, 1))
    assert e.value.key == 5 and e.value.args == (5,)
    with pytest.raises(IndexError) as e:  # outside the ring
        buf.gather(np.array([8], np.int64), _outputs(buf, 1))
    assert (e.value.index, e.value.bound) == (8, 8)


def test_circular_buffer_add_argument_errors_name_the_argument():
    buf = _buffer()
    with pytest.raises(ValueError) as e:
        buf.add(np.zeros(2, np.uint8), 0, 1.0, False, (7,), None, False)
    assert (e.value.expected, e.value.received) == (4, 5)
    with pytest.raises(ValueError) as e:
        buf.add(np.zeros(3, np.uint8), 0, 1.0, False, (), None, False)
    assert e.value.field == 0 and "observation" in str(e.value)
    assert buf.add_count == 0


def test_circular_buffer_sampling_errors_carry_counts():
    buf = _buffer()
    with pytest.raises(RuntimeError) as e:
        buf.sample_indices(4)
    assert e.value.needed == 2  # stack_size + update_horizon
    prioritized = _buffer(prioritized=True)
    with pytest.raises(IndexError) as e:
        prioritized.get_priorities(np.array([0, 8], np.int64))
    assert (e.value.index, e.value.bound) == (8, prioritized.padded_leaves)
    with pytest.raises(IndexError) as e:
        prioritized.set_priorities(np.array([9], np.int64), np.array([1.0]))
    assert (e.value.index, e.value.bound) == (9, 8)
    with pytest.raises(IndexError) as e:
        buf.column(4)
    assert (e.value.index, e.value.bound) == (4, 4)
