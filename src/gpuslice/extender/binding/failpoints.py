"""Failpoints: named places in the bind path where a fault-injection test can kill or stall us.

Like etcd's gofail, a failpoint costs one dictionary lookup when it is not armed. They are armed
only through the environment variable ``GPUSLICE_FAILPOINTS``, read once at startup, e.g.
``GPUSLICE_FAILPOINTS="bind-after-lock=exit"`` or ``"bind-before-binding=sleep(5)"`` (several
separated by ``;``). ``exit`` ends the process at once with status 137, without cleanup, as a
SIGKILL would; ``sleep(s)`` stalls the bind for ``s`` seconds. The chaos tier uses them to crash
the extender between taking HAMi's node lock and creating the Binding, a moment no outside signal
can hit reliably.

Names: ``bind-after-lock`` (node lock taken, nothing written yet), ``bind-before-binding`` (the
truth checked, the Binding with the annotations about to be posted), ``bind-after-binding``
(Binding created, not yet answered).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Mapping

ENV = "GPUSLICE_FAILPOINTS"
NAMES = frozenset({"bind-after-lock", "bind-before-binding", "bind-after-binding"})
EXIT_STATUS = 137
_SLEEP = re.compile(r"sleep\(([0-9]*\.?[0-9]+)\)")


class FailpointError(ValueError):
    """A malformed ``GPUSLICE_FAILPOINTS`` value."""


def parse(text: str) -> dict[str, str]:
    """``name=action;...`` -> {name: action}; raises FailpointError naming what is wrong."""
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, action = item.partition("=")
        if not sep or name not in NAMES:
            raise FailpointError(f"{ENV}: unknown failpoint {name!r}; known: {', '.join(sorted(NAMES))}")
        if action != "exit" and _SLEEP.fullmatch(action) is None:
            raise FailpointError(f"{ENV}: {name}: action must be exit or sleep(<seconds>), got {action!r}")
        out[name] = action
    return out


class Failpoints:
    """The armed failpoints (none by default).

    Args:
        armed: failpoint name -> action.
        exit_: how ``exit`` ends the process (tests replace it).
    """

    def __init__(self, armed: Mapping[str, str] | None = None, exit_: Callable[[int], object] = os._exit):
        self._armed = dict(armed or {})
        self._exit = exit_

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Failpoints:
        """The failpoints armed by ``GPUSLICE_FAILPOINTS`` (none when unset)."""
        return cls(parse((os.environ if environ is None else environ).get(ENV, "")))

    @property
    def armed(self) -> bool:
        """True when any failpoint is armed."""
        return bool(self._armed)

    async def hit(self, name: str) -> None:
        """Act on the failpoint ``name`` if it is armed."""
        action = self._armed.get(name)
        if action is None:
            return
        if action == "exit":
            self._exit(EXIT_STATUS)
            return
        match = _SLEEP.fullmatch(action)
        if match is not None:
            await asyncio.sleep(float(match.group(1)))
