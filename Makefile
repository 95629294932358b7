# The two Quickstart commands: `make demo` (the main job) and `make test`.
# STACK=current: the current stack (constraints/current.txt, CPython 3.13) in .venv-current instead
# of the pinned one (constraints/dopamine.txt) in .venv; see scripts/bootstrap.sh.
STACK ?= pinned
VENV ?= $(if $(filter current,$(STACK)),.venv-current,.venv)
PY := $(VENV)/bin/python

.PHONY: bootstrap demo test test-fast bench sanitize

bootstrap:
	STACK=$(STACK) MEMOIRE_VENV=$(VENV) ./scripts/bootstrap.sh

# A short distributed CartPole DQN (embedded server, learner, 2 actors) ending with a plot.
demo: bootstrap
	$(VENV)/bin/memoire train --gin_files configs/demo_distributed.gin --base_dir runs/demo
	$(VENV)/bin/memoire plot runs/demo
	@echo "learning curves: runs/demo/learning_curves.png"

# The whole test suite against the installed package, as a wheel installs it (pytest, not
# `python -m pytest`, so the source tree is not on sys.path; the tests that run from the
# repository root, as a user does there, import the checkout, which bootstrap gave the same
# extension), in two worker processes (pytest-xdist),
# each taking whole modules, so a module's fixtures are set up once: most tests wait on a
# training subprocess or a socket, and one process leaves a 2-core machine a third idle. The 15
# slowest tests are listed at the end, to keep CI's time in view.
test: bootstrap
	$(VENV)/bin/pytest -q -n 2 --dist loadfile --durations=15

# The fast tier while editing (docs/ARCHITECTURE.md, "Tests"): each module's own tests, the slow
# ones left out, in two worker processes.
test-fast: bootstrap
	$(VENV)/bin/pytest -q -n 2 --dist loadfile -m "unit and not slow"

# The benchmark suite against Dopamine, cpprb, NumPy and raw pyzmq (about 10 minutes on 2 cores);
# rewrites benchmarks/RESULTS.md and benchmarks/scaling.png.
bench: bootstrap
	$(VENV)/bin/memoire bench --out benchmarks/RESULTS.md

sanitize:
	./scripts/sanitize.sh
