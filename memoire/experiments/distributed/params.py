"""Parameter bytes: how the learner's network parameters travel to its actors (flax's msgpack
format, never pickle)."""

from __future__ import annotations

from typing import Any


def params_to_bytes(params: Any) -> bytes:
    """Serializes a parameter pytree with flax's msgpack format (no pickle)."""
    from flax import serialization

    return serialization.to_bytes(params)


def params_from_bytes(template: Any, payload: bytes) -> Any:
    """Restores parameters shaped like ``template`` from :func:`params_to_bytes` output.

    Raises:
      ValueError: if the payload does not match the template's structure.
    """
    from flax import serialization

    try:
        return serialization.from_bytes(template, payload)
    except Exception as e:  # msgpack and flax raise several types for a bad payload
        raise ValueError(f"parameter payload does not match the agent's parameters: {e}") from e
