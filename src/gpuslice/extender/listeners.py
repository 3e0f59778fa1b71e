"""Listener lists: one event, any number of consumers, each registered once where the server is built.

A producer (the feed, the bind flow, the leader election) owns one ``Listeners`` per event it
reports and calls ``emit``; ``serve.build`` registers every consumer with ``add``, in one place.
kube-scheduler composes its informer consumers the same way: one ``AddEventHandler`` call per
consumer (``pkg/scheduler/eventhandlers.go`` in kubernetes/kubernetes), instead of a single slot
that a second consumer has to wrap by hand.

Listeners run synchronously, in the order they were added, on the producer's call; an exception in
one reaches the producer and the later ones do not run (exactly as a single callback would).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, ParamSpec

P = ParamSpec("P")


class Listeners(Generic[P]):
    """The consumers of one event, called with the event's arguments (``Listeners[[str, bool]]``)."""

    __slots__ = ("_listeners",)

    def __init__(self) -> None:
        self._listeners: tuple[Callable[P, None], ...] = ()

    def add(self, listener: Callable[P, None]) -> None:
        """Call ``listener`` on every later ``emit``, after the listeners added before it."""
        self._listeners = (*self._listeners, listener)

    def emit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Tell every listener, in order."""
        for listener in self._listeners:
            listener(*args, **kwargs)

    def __bool__(self) -> bool:
        """True when some listener is registered (a producer may skip the work of an event)."""
        return bool(self._listeners)

    def __len__(self) -> int:
        """How many listeners are registered."""
        return len(self._listeners)
