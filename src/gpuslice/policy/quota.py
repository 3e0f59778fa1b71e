"""Namespace GPU quota (docs/hami-compat.md section 12), as a pure value.

Usage is counted per card: a container asking 2 cards of 1000 MiB uses count 2 and memory 2000.
A limit of ``None`` is unlimited; a limit of 0 blocks every request.
"""

from __future__ import annotations

import msgspec


class QuotaView(msgspec.Struct, frozen=True, kw_only=True):
    """A namespace's limits and what it already uses (count = cards, memory MiB, cores percent).

    Attributes:
        count_limit: most cards at once, or None.
        memory_limit: most MiB summed over cards, or None.
        cores_limit: most cores summed over cards, or None.
        used_count: cards in use.
        used_memory: MiB in use.
        used_cores: cores in use.
    """

    count_limit: int | None = None
    memory_limit: int | None = None
    cores_limit: int | None = None
    used_count: int = 0
    used_memory: int = 0
    used_cores: int = 0

    @property
    def unlimited(self) -> bool:
        """True when no limit is set."""
        return self.count_limit is None and self.memory_limit is None and self.cores_limit is None

    def admits(self, count: int, memory: int, cores: int) -> bool:
        """True when adding ``count`` cards with ``memory`` and ``cores`` in total stays within limits."""
        return (
            _within(self.count_limit, self.used_count, count)
            and _within(self.memory_limit, self.used_memory, memory)
            and _within(self.cores_limit, self.used_cores, cores)
        )

    def plus(self, count: int, memory: int, cores: int) -> QuotaView:
        """The view with more usage added."""
        return msgspec.structs.replace(
            self,
            used_count=self.used_count + count,
            used_memory=self.used_memory + memory,
            used_cores=self.used_cores + cores,
        )

    def cleared(self) -> QuotaView:
        """The same limits with no usage (used to tell 'quota full now' from 'never fits')."""
        return msgspec.structs.replace(self, used_count=0, used_memory=0, used_cores=0)


def _within(limit: int | None, used: int, add: int) -> bool:
    if limit is None:
        return True
    return limit > 0 and used + add <= limit


UNLIMITED = QuotaView()
