"""A small bounded LRU map for per-pod memos (filter results, scores, finished binds)."""

from __future__ import annotations

import collections
from typing import Any

DEFAULT_SIZE = 20_000


class Memo(collections.OrderedDict[str | bytes, Any]):
    """An insertion-ordered map that evicts its oldest entries beyond ``size``."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        super().__init__()
        self._size = size

    def put(self, key: str | bytes, value: Any) -> None:
        """Insert or refresh ``key``, evicting the oldest entry beyond the size."""
        self[key] = value
        self.move_to_end(key)
        while len(self) > self._size:
            self.popitem(last=False)
