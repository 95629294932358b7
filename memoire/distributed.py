"""Distributed training (placeholder; filled in below)."""
import gin


@gin.configurable(module="memoire.distributed")
class DistributedConfig:
    def __init__(self, num_actors=0):
        self.num_actors = num_actors


def run(facts, config):
    raise NotImplementedError
