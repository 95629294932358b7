"""The elements of the JAX face: Dopamine's own types (``dopamine.jax.replay_memory.elements``).

memoire adds no element type: a buffer takes Dopamine's ``TransitionElement`` (one step, as an
agent adds it) and returns Dopamine's ``ReplayElement`` (a batch of stacked transitions), so an
agent's code and its jitted steps see exactly Dopamine's pytrees.
"""

from dopamine.jax.replay_memory import elements

ReplayElement = elements.ReplayElement
TransitionElement = elements.TransitionElement

# ReplayElement's fields in order: a batch's arrays, and the leaves of a checkpointed element.
ELEMENT_FIELDS = ("state", "action", "reward", "next_state", "is_terminal", "episode_end")
