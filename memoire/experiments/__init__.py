"""Experiment tooling built on the library: ``memoire train`` (train), the tracked Dopamine
runner it runs (runner), distributed training (distributed), sweeps (sweep), run records
(trackers), learning curves (plot) and which replay buffer a Dopamine agent runs on
(replay_routing).

The library (``memoire`` and ``memoire.dopamine_compat``) never imports this package.
Modules are imported by name; importing the package imports none of them (train pulls in
TensorFlow and Dopamine).
"""
