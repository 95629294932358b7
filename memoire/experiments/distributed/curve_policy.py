"""The CURVE policy the launchers share: whether a learner's sockets take the run's keys
(``RayConfig.curve``, ``SlurmConfig.curve``), and the warning of a learner bound beyond
loopback without them (``--insecure``)."""

from __future__ import annotations

from typing import Optional

from memoire import transport

CURVE_SETTINGS = ("auto", "on", "off")  # RayConfig.curve, SlurmConfig.curve


def use_curve(setting: str, host: str) -> bool:
    """Whether a learner binding on ``host`` uses CURVE keys under a launcher's ``curve``
    ``setting``: 'auto' when ``host`` is beyond loopback, 'on' always, 'off' never.

    Raises:
      ValueError: a setting not in :data:`CURVE_SETTINGS`.
    """
    if setting not in CURVE_SETTINGS:
        raise ValueError(f"curve must be one of {CURVE_SETTINGS}, got {setting!r}")
    return setting == "on" or (setting == "auto" and transport.beyond_loopback(host))


def insecure_warning(setting: str, endpoint: str) -> Optional[str]:
    """The one warning of a run whose learner binds ``endpoint`` beyond loopback without keys
    (``curve`` 'off', the command line's ``--insecure``); None when there is nothing to say."""
    if setting != "off":
        return None
    return transport.clear_text_warning(
        "--insecure",
        [endpoint],
        "without --insecure, the learner takes only actors holding the run's keys",
    )
