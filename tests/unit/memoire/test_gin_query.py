"""memoire.gin_query.query: the one "gin value or default" helper."""

import gin
import pytest
from _subprocess_env import assert_clean_exit, run_script

from memoire.gin_query import query


@pytest.fixture
def scoped_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@gin.configurable("_gin_query_probe", module="tests.gin_query")
def _probe(size=3, name=None):
    return size, name


def test_bound_value_else_default(scoped_gin):
    assert query("_gin_query_probe.size", 7) == 7  # registered, not bound
    assert query("tests.gin_query._gin_query_probe.name", "x") == "x"
    gin.parse_config("_gin_query_probe.size = 5\n_gin_query_probe.name = 'a'")
    assert query("_gin_query_probe.size", 7) == 5
    assert query("tests.gin_query._gin_query_probe.name", "x") == "a"
    assert query("_gin_query_probe.name", None) == "a"


def test_unknown_configurable_gives_the_default(scoped_gin):
    sentinel = object()
    assert query("no_such_configurable_anywhere.x", sentinel) is sentinel


def test_without_gin_every_query_gives_its_default(tmp_path):
    """A process that never imported gin has bound nothing: query answers the default and
    leaves gin unimported (a core install, without the gin extra, uses the module too)."""
    proc = run_script(
        """
        import sys
        from memoire.gin_query import query
        assert query("create_agent.agent_name", "dflt") == "dflt"
        assert "gin" not in sys.modules, "gin was imported"
        print("OK")
        """,
        tmp_path,
    )
    assert_clean_exit(proc)
