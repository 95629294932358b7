"""The one "gin value or default" helper, for the library and the tools built on it."""

from __future__ import annotations

from typing import Any

import gin


def query(selector: str, default: Any) -> Any:
    """The value gin has bound to ``selector`` (e.g. ``'create_agent.agent_name'``), or
    ``default`` when nothing is bound to it (or no configurable of that name is registered)."""
    try:
        return gin.query_parameter(selector)
    except ValueError:
        return default
