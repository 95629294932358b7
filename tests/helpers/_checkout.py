"""Whether the repository's own memoire/ folder imports: what a user gets from the repository
root, where Python finds the checkout's memoire/ before any installed package.

``make bootstrap`` puts the extension it installed beside the sources (scripts/bootstrap.sh), so
under ``make test`` the checkout imports, and the tests that run from the root (the README's
blocks, tests/unit/memoire/test_packaging.py) run there. Testing a wheel in a fresh environment
(scripts/build_wheel.sh, cibuildwheel), the checkout holds no extension of that build, and those
tests run elsewhere or say why they cannot.
"""

import filecmp
import os

from _subprocess_env import environ

import memoire._core

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def checkout_imports() -> tuple:
    """``(True, "")`` when the checkout's memoire/ holds the extension this interpreter runs
    (the same file as the memoire under test's, or it is the memoire under test); else
    ``(False, why)``."""
    ours = os.path.abspath(memoire._core.__file__)
    beside = os.path.join(ROOT, "memoire", os.path.basename(ours))
    if os.path.dirname(ours) == os.path.dirname(beside):
        return True, ""
    if os.path.isfile(beside) and filecmp.cmp(ours, beside, shallow=False):
        return True, ""
    return False, (
        f"the checkout's memoire/ holds no {os.path.basename(ours)} of the memoire under test "
        f"({ours}); `make bootstrap` puts one there"
    )


def root_env() -> dict:
    """The environment of a user's shell at the repository root: nothing on PYTHONPATH."""
    env = environ()
    for name in ("PYTHONPATH", "PYTHONSAFEPATH"):
        env.pop(name, None)
    return env
