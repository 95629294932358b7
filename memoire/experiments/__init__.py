"""Experiment tooling built on the library: ``memoire train`` (train), distributed training
(distributed, distributed_zmq), sweeps (sweep), run records (trackers), learning curves
(plot) and which replay buffer a Dopamine agent runs on (replay_routing).

The library (``memoire`` and ``memoire.dopamine_compat``) never imports this package.
Modules are imported by name; importing the package imports none of them (train pulls in
TensorFlow and Dopamine).
"""
