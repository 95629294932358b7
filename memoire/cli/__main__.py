"""``python -m memoire.cli``: the ``memoire`` command (:func:`memoire.cli.main`)."""

import sys

from memoire.cli import main

if __name__ == "__main__":
    sys.exit(main())
