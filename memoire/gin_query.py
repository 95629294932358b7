"""The one "gin value or default" helper, for the library and the tools built on it.

It needs no gin: bindings live in the ``gin`` module, so in a process that never imported gin
nothing is bound and every query answers its default. A core install (no gin extra) imports
this module like any other, and only code that loads gin files ever sees a binding.
"""

from __future__ import annotations

import sys
from typing import Any


def query(selector: str, default: Any) -> Any:
    """The value gin has bound to ``selector`` (e.g. ``'create_agent.agent_name'``), or
    ``default`` when nothing is bound to it (or no configurable of that name is registered, or
    gin was never imported)."""
    gin = sys.modules.get("gin")
    if gin is None:
        return default
    try:
        return gin.query_parameter(selector)
    except ValueError:
        return default
