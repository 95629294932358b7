"""The JAX ``ReplayBuffer``'s orbax checkpoints: one manager per checkpoint folder, and the
save and load of Dopamine's layout (``<dir>/<step>/replay/``, decoded strictly by
:mod:`.checkpointers`).
"""

from __future__ import annotations

import os

from orbax import checkpoint as orbax

from memoire.checkpoint_io import CheckpointError
from memoire.dopamine_compat.jax_replay_buffer import checkpointers


class CheckpointManagers:
    """The orbax managers of one buffer, one per checkpoint folder (Dopamine caches them with
    ``functools.lru_cache`` on a method, which would keep up to 128 buffers alive; these go
    with their buffer).

    Args:
      keep: checkpoints each manager keeps (the buffer's ``checkpoint_duration``).
    """

    def __init__(self, keep: int) -> None:
        self._keep = int(keep)
        self._managers: dict = {}

    def get(self, checkpoint_dir: str) -> orbax.CheckpointManager:
        """The manager of ``checkpoint_dir`` (made on first use)."""
        if checkpoint_dir not in self._managers:
            # orbax's current API (item handlers, CheckpointArgs registered for the handler):
            # the same folders and files as Dopamine's manager (<dir>/<step>/replay/), so
            # either buffer loads the other's checkpoints.
            self._managers[checkpoint_dir] = orbax.CheckpointManager(
                checkpoint_dir,
                item_handlers={"replay": checkpointers.CheckedCheckpointHandler()},
                options=orbax.CheckpointManagerOptions(max_to_keep=self._keep, create=True),
            )
        return self._managers[checkpoint_dir]

    def forget(self, checkpoint_dir: str) -> None:
        """Closes and drops the manager of ``checkpoint_dir`` (a no-op without one), before
        the folder is renamed or removed."""
        manager = self._managers.pop(checkpoint_dir, None)
        if manager is not None and hasattr(manager, "close"):
            manager.close()


def save(manager: orbax.CheckpointManager, buffer, iteration_number: int) -> None:
    """Writes ``buffer``'s checkpoint ``iteration_number`` with ``manager`` (see
    ``ReplayBuffer.save``); whole when this returns."""
    if iteration_number in manager.all_steps():
        # A run killed after saving this step but before Dopamine's completion sentinel
        # resumes at the same iteration and saves it again; orbax never overwrites a step,
        # so the stale one (another run's transitions) would stay. Replace it.
        manager.delete(iteration_number)
    manager.save(
        iteration_number,
        args=orbax.args.Composite(replay=checkpointers.ReplayCheckpointArgs(buffer)),
    )
    # orbax saves asynchronously: the checkpoint is whole when save returns (Dopamine's
    # runner writes its completion sentinel next, and a resumed run may load it at once).
    manager.wait_until_finished()


def load(manager: orbax.CheckpointManager, buffer, checkpoint_dir: str, iteration_number: int):
    """Restores ``buffer`` from checkpoint ``iteration_number`` of ``manager`` (the one of
    ``checkpoint_dir``; see ``ReplayBuffer.load``): checked before anything changes.

    Raises:
      FileNotFoundError: no such checkpoint. CheckpointError: a malformed one, or one that does
        not fit ``buffer`` (unchanged then).
    """
    state_dict = manager.restore(
        iteration_number, args=orbax.args.Composite(replay=checkpointers.ReplayCheckpointArgs())
    )
    try:
        buffer.from_state_dict(state_dict["replay"])
    except CheckpointError:
        raise
    except (ValueError, TypeError, KeyError, OverflowError) as e:
        path = os.path.join(
            str(checkpoint_dir), str(iteration_number), "replay", "checkpoint.msgpack"
        )
        raise CheckpointError(f"{path}: {e}") from e
