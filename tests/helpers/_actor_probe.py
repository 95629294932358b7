"""Run in an actor process of memoire.experiments.distributed.local_launch._actor_context() by
test_distributed: what that process found imported and running when it started."""

import os
import sys


def report(queue) -> None:
    from jax._src import xla_bridge

    queue.put(
        {
            "pid": os.getpid(),
            "parent": os.getppid(),
            "imported": [
                m
                for m in ("tensorflow", "jax", "dopamine.discrete_domains.run_experiment")
                if m in sys.modules
            ],
            "jax_backends": len(xla_bridge._backends),
        }
    )
