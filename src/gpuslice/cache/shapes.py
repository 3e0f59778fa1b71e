"""A decayed histogram of recently requested pod shapes: the extender's target workload for FGD.

Each observation multiplies the existing weights by ``decay`` and adds 1 to its shape, so a shape
seen k requests ago counts ``decay**k`` (effective window ``1 / (1 - decay)`` requests, 200 for the
default 0.995). Shapes whose weight falls below ``floor`` are dropped and at most ``max_shapes``
are kept (the lightest go first), so memory and the cost of an observation stay bounded.
"""

from __future__ import annotations

from gpuslice.policy import registry


class ShapeHistogram:
    """Not thread-safe on its own; the cache calls it under its lock."""

    def __init__(self, decay: float = 0.995, max_shapes: int = 64, floor: float = 1e-3) -> None:
        """Configure the decay per observation and the bounds."""
        if not 0.0 < decay <= 1.0:
            raise ValueError("decay must be in (0, 1]")
        self._decay = decay
        self._max = max_shapes
        self._floor = floor
        self._w: dict[registry.Shape, float] = {}
        self._cached: registry.Workload | None = None

    def observe(self, shape: registry.Shape) -> None:
        """Record one request of this shape."""
        d = self._decay
        w = {s: v * d for s, v in self._w.items() if v * d >= self._floor}
        w[shape] = w.get(shape, 0.0) + 1.0
        if len(w) > self._max:
            keep = sorted(w.items(), key=lambda sv: -sv[1])[: self._max]
            w = dict(keep)
        self._w = w
        self._cached = None

    def workload(self) -> registry.Workload | None:
        """The shapes with weights summing to 1, in a fixed order; None before any observation."""
        if not self._w:
            return None
        if self._cached is None:
            items = sorted(
                self._w.items(), key=lambda sv: (sv[0].count, sv[0].share_milli, sv[0].cpu_milli, sv[0].types)
            )
            total = sum(v for _, v in items)
            self._cached = registry.Workload(tuple(s for s, _ in items), tuple(v / total for _, v in items))
        return self._cached
