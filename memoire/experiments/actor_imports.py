"""What every actor process imports before it reads its gin files, imported once by the server
process that a local run forks its actors from (:func:`memoire.experiments.distributed.run`).

Nothing here starts a JAX backend or a thread of TensorFlow's (forking after either is unsafe;
numpy's BLAS threads are made fork-safe by OpenBLAS): TensorFlow, JAX and Dopamine are imported,
not used. Their import chatter is kept out as in every memoire process
(:func:`memoire.cli.configure_logging`, from ``$MEMOIRE_LOG_LEVEL``).
"""

import warnings

from memoire import cli

cli.configure_logging()
# An actor of a run started as `python -m memoire.cli` runs that module again as __mp_main__, as
# a spawned one does; here it is imported already, which runpy warns of (harmless: its main is
# guarded).
warnings.filterwarnings(
    "ignore", r"'memoire\.[\w.]+' found in sys\.modules", RuntimeWarning, "runpy"
)

from memoire.experiments import distributed, runner  # noqa: E402, F401  (the actor's own code)

runner.import_configurables()
