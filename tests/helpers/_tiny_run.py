"""The tiny distributed-training command that tests and benchmarks run, written once.

``memoire train`` on configs/dqn_cartpole_jax_distributed.gin (JAX DQN on CartPole, a learner
and 2 actor processes) with budgets small enough for CI. Callers add the bindings their check
needs; gin keeps the last binding of a name, so theirs win over :data:`TINY`'s. benchmarks/
imports it too (with tests/helpers/ on sys.path).
"""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DIST_GIN = os.path.join(ROOT, "configs", "dqn_cartpole_jax_distributed.gin")

# One short iteration: 300 training steps (enough for actors to stream and the learner to
# train after 50 transitions), a 20-step evaluation, a small network.
TINY = (
    "Runner.num_iterations = 1",
    "Runner.training_steps = 300",
    "Runner.evaluation_steps = 20",
    "JaxDQNAgent.min_replay_history = 50",
    "ClassicControlDQNNetwork.hidden_units = 16",
    "DistributedConfig.publish_period = 20",
    "DistributedConfig.chunk_size = 8",
)


def train_command(
    base_dir, *bindings, gin_file=DIST_GIN, tiny=True, launcher=None, ray_address=None
):
    """argv of ``memoire train`` (``python -m memoire.cli train``, this interpreter).

    Args:
      base_dir: str, the run's ``--base_dir``.
      *bindings: gin bindings (str) after :data:`TINY`'s (``tiny=True``), so they override it.
      gin_file: str, the ``--gin_files`` config.
      tiny: bool, whether :data:`TINY`'s bindings come first.
      launcher, ray_address: ``--launcher`` and ``--ray_address`` when given.
    """
    cmd = [sys.executable, "-m", "memoire.cli", "train", "--base_dir", str(base_dir)]
    cmd += ["--gin_files", gin_file]
    if launcher is not None:
        cmd += ["--launcher", launcher]
    if ray_address is not None:
        cmd += ["--ray_address", ray_address]
    for binding in (TINY if tiny else ()) + tuple(bindings):
        cmd += ["--gin_bindings", binding]
    return cmd
