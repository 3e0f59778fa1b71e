"""klog-style leveled, structured logging: ``msg key=value key="quoted value"``.

Verbosity (``-v``) gates detail as in kube-scheduler: 0-2 requests and outcomes, 4 one line per
node (feasible, score, reason), 5 one line per card (free, requested, fit). Call sites check
``log.enabled(level)`` before building per-node or per-card lines, so the hot path costs one
comparison when the level is off.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

LOGGER_NAME = "gpuslice.extender"


def _value(v: Any) -> str:
    s = str(v)
    if not s or any(c in s for c in ' "=\n'):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return s


def format_kv(msg: str, kv: dict[str, Any]) -> str:
    """``msg k1=v1 k2=v2`` with values quoted when they contain spaces, quotes or '='."""
    if not kv:
        return msg
    return msg + " " + " ".join(f"{k}={_value(v)}" for k, v in kv.items())


class Log:
    """A leveled structured logger.

    Args:
        verbosity: the ``-v`` level; messages above it are dropped.
        logger: the stdlib logger to write to.
    """

    def __init__(self, verbosity: int = 0, logger: logging.Logger | None = None) -> None:
        self.verbosity = verbosity
        self._logger = logger or logging.getLogger(LOGGER_NAME)

    def enabled(self, level: int) -> bool:
        """True when messages at ``level`` are written."""
        return level <= self.verbosity

    def v(self, level: int, msg: str, **kv: Any) -> None:
        """Write an info line at verbosity ``level``."""
        if level <= self.verbosity:
            self._logger.info(format_kv(msg, kv))

    def info(self, msg: str, **kv: Any) -> None:
        """Write an info line (level 0)."""
        self._logger.info(format_kv(msg, kv))

    def warning(self, msg: str, **kv: Any) -> None:
        """Write a warning line."""
        self._logger.warning(format_kv(msg, kv))

    def error(self, msg: str, **kv: Any) -> None:
        """Write an error line."""
        self._logger.error(format_kv(msg, kv))


def configure(verbosity: int) -> Log:
    """Send gpuslice logs to stderr in klog's layout and return a ``Log`` at ``verbosity``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(levelname).1s%(asctime)s %(name)s] %(message)s", "%m%d %H:%M:%S")
    )
    root = logging.getLogger("gpuslice")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False
    return Log(verbosity)
