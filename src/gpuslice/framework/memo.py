"""A bounded insertion-ordered map for per-pod memos (parsed requests, filter results, finished binds).

Every memo the extender keeps between calls holds what requests brought, so each is bounded twice:
by entries and by bytes. An entry weighs its key's length plus ``weigh(value)`` plus a fixed
``OVERHEAD`` for the dict slot and the objects around it; ``weigh`` estimates what the value holds
that no other structure holds (strings, arrays), so a memo of small values is bounded by its entry
count and a memo of large ones by its budget. Keys are bounded where they are decoded
(``extender.wire``), so no single entry can exceed the budget by much.

``put`` inserts at the end (a re-put moves the key there) and evicts from the front, oldest
first; ``get`` does not refresh an entry.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

OVERHEAD = 160
"""Bytes counted per entry besides its key and value: the dict slot, the key object's header, the
value's container."""


def _fixed(value: object) -> int:
    """``weigh`` of a value that holds nothing of its own (a flag, a time, a shared reference)."""
    return 0


def strings(value: object) -> int:
    """``weigh`` of a value made of strings: their lengths, through lists, tuples and dicts.

    Numbers and other objects count nothing besides their slot (8 bytes in a list, 16 in a dict).
    """
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, list | tuple):
        return sum(8 + strings(v) for v in value)
    if isinstance(value, dict):
        return sum(16 + strings(k) + strings(v) for k, v in value.items())
    return 0


class Memo(collections.OrderedDict[str | bytes, Any]):
    """An insertion-ordered map that evicts its oldest entries beyond ``entries`` or ``budget`` bytes.

    Args:
        entries: most entries kept.
        budget: most bytes kept (the sum of the entries' weights, module docstring).
        weigh: bytes a value holds of its own (default: none).
    """

    def __init__(self, entries: int, budget: int, weigh: Callable[[Any], int] = _fixed) -> None:
        super().__init__()
        if entries < 1 or budget < 1:
            raise ValueError("a memo needs room for at least one entry and one byte")
        self._entries = entries
        self._budget = budget
        self._weigh = weigh
        self._weights: dict[str | bytes, int] = {}
        self.bytes = 0
        """The weight of the entries held."""

    def put(self, key: str | bytes, value: Any) -> None:
        """Insert or refresh ``key`` at the end, evicting the oldest entries beyond the bounds.

        An entry heavier than the whole budget is not kept (the key is dropped).
        """
        weight = len(key) + OVERHEAD + self._weigh(value)
        self._drop(key)
        if weight > self._budget:
            return
        super().__setitem__(key, value)
        self._weights[key] = weight
        self.bytes += weight
        while len(self) > self._entries or self.bytes > self._budget:
            self._drop(next(iter(self)))

    def _drop(self, key: str | bytes) -> None:
        if key in self._weights:
            self.bytes -= self._weights.pop(key)
            super().__delitem__(key)

    def __setitem__(self, key: str | bytes, value: Any) -> None:
        """``put``: every insertion is weighed and bounded."""
        self.put(key, value)

    def __delitem__(self, key: str | bytes) -> None:
        if key not in self._weights:
            raise KeyError(key)
        self._drop(key)

    def pop(self, key: str | bytes, *default: Any) -> Any:
        """Remove ``key`` and return its value (``default`` when absent, if given)."""
        if key in self._weights:
            value = self[key]
            self._drop(key)
            return value
        if default:
            return default[0]
        raise KeyError(key)

    def popitem(self, last: bool = True) -> tuple[str | bytes, Any]:
        """Remove and return the newest entry (the oldest with ``last=False``)."""
        key = next(reversed(self)) if last else next(iter(self))
        return key, self.pop(key)

    def clear(self) -> None:
        """Forget every entry."""
        super().clear()
        self._weights.clear()
        self.bytes = 0
