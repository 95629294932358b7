"""What Dopamine's circular buffer and its checkpoint files share: file names and the ring's
invalid range. Its own module so that ``circular_replay_buffer`` (which saves through
``checkpoint``) and ``checkpoint`` (which checks a file's invalid range) need not import each
other. Public names are re-exported by ``circular_replay_buffer``, as Dopamine's module has them.
"""

import numpy as np

# A prefix that can not collide with variable names for checkpoint files (Dopamine's).
STORE_FILENAME_PREFIX = "$store$_"


def invalid_range(cursor, replay_capacity, stack_size, update_horizon):
    """Dopamine's cursor-related invalid indices: c - N, ..., c + K - 1 (mod capacity).

    Returns:
      int64[stack_size + update_horizon].
    """
    assert cursor < replay_capacity
    return np.array(
        [
            (cursor - update_horizon + i) % replay_capacity
            for i in range(stack_size + update_horizon)
        ]
    )
