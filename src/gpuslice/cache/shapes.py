"""The learned target workload of FGD-style policies: a decayed histogram of requested pod shapes.

``gpuslice serve`` feeds it the shape of every GPU pod it filters (``cache.ClusterCache``) and
``gpuslice simulate --workload online`` the shape of every arriving GPU pod (``sim.engine``); both
build it from the same ``model.config.WorkloadSettings`` with this one class, so for the same
request sequence they hand the policies the same workloads (docs/workload.md).

The rules, for requests ``s_1, s_2, ..., s_t`` (``observe`` in that order):

* weight: the weight of shape x is the sum of ``decay**(t - i)`` over the requests i with
  ``s_i = x`` that still count: the latest request weighs 1, one seen k requests ago ``decay**k``.
* window: with ``window`` W > 0 only the W most recent requests count (i > t - W).
* bounds: after each request, a shape whose weight fell below ``floor`` is forgotten, and while more
  than ``max_shapes`` shapes are held the lightest other than the one just requested is forgotten
  (ties: the one held the longest goes first). A forgotten shape's past requests never count again;
  a later request of it starts it afresh.
* admission: a shape with a number outside ``gpuslice.model.limits`` (negative, or beyond what any
  decoded request can make) or with more than ``MAX_TYPES`` models (or a model name longer than a
  Kubernetes name) is refused and counted in ``refused``; it never weighs in any workload. The
  decoders already refuse such requests; this is the histogram's own guard, since one such shape
  would reach every later decision of the policies that learn the workload.
* trust: until ``min_count`` requests were observed the histogram is untrusted and ``workload()``
  is None (callers substitute ``fallback`` for the policies that learn the workload).
* snapshot: ``workload()`` is a snapshot of the normalized weights, taken when the histogram
  becomes trusted and re-taken after a request that leaves the live normalized weights at a
  total-variation distance of at least ``drift`` from it (``drift`` 0: after every request). The
  snapshot is the same object until re-taken, so memoized scores keyed on it stay valid.

Cost: a weight is stored scaled by ``decay**-origin`` (each request adds ``decay**(origin - i)``;
the true weight is ``stored * decay**(t - origin)``), so a request touches one entry instead of
decaying all of them; the origin moves (one pass) only before the scale would overflow. Window
evictions come off a deque, and shapes below the floor off a heap of stored values, whose
threshold ``floor * decay**(origin - t)`` rises with t. Observing is O(1) amortized apart from the
drift test, one pass over the held shapes (at most ``max_shapes``).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math

from gpuslice.model import config as model_config
from gpuslice.model import limits
from gpuslice.policy import api

MAX_SHAPES = 512
"""Default bound on the shapes held."""
FLOOR = 1e-3
"""Default weight below which a shape is forgotten (the latest request weighs 1)."""
MAX_TYPES = 64
"""Most card models a shape may name (``nvidia.com/use-gputype`` lists a few)."""
_MAX_SCALE_EXP = 600.0
"""The origin moves once ``decay**(origin - t)`` would exceed ``e**600`` (floats overflow at ~e**709)."""


def admissible(shape: api.Shape) -> bool:
    """True when every number of ``shape`` lies within ``gpuslice.model.limits`` (module docstring)."""
    return (
        0 <= shape.cpu_milli <= limits.MAX_CPU_MILLI
        and 0 <= shape.share_milli <= limits.MAX_SHAPE_SHARE
        and 0 <= shape.count <= limits.MAX_SHAPE_CARDS
        and len(shape.types) <= MAX_TYPES
        and all(len(t) <= limits.MAX_NAME for t in shape.types)
    )


def sort_key(shape: api.Shape) -> tuple[int, int, int, tuple[str, ...]]:
    """The fixed order of shapes in a workload: GPU count, share, CPU, models."""
    return (shape.count, shape.share_milli, shape.cpu_milli, shape.types)


def total_variation(p: api.Workload | None, q: api.Workload | None) -> float:
    """Total-variation distance of two workloads (half the L1 distance; 1 when only one exists)."""
    if p is None or q is None:
        return 0.0 if p is q else 1.0
    qs = dict(zip(q.shapes, q.weights, strict=True))
    out = 0.0
    for s, w in zip(p.shapes, p.weights, strict=True):
        out += abs(w - qs.pop(s, 0.0))
    return 0.5 * (out + sum(qs.values()))


class ShapeHistogram:
    """The learned target workload (module docstring). Not thread-safe; the cache holds its lock."""

    def __init__(
        self,
        settings: model_config.WorkloadSettings = model_config.DEFAULT_WORKLOAD,
        max_shapes: int = MAX_SHAPES,
        floor: float = FLOOR,
    ) -> None:
        """Take the settings (checked, except the fallback name) and the memory bounds.

        Raises:
            model_config.WorkloadSettingError: an invalid setting.
            ValueError: ``max_shapes`` < 1 or ``floor`` outside [0, 1).
        """
        problems = model_config.workload_errors(settings)
        if problems:
            raise problems[0]
        if max_shapes < 1 or not 0.0 <= floor < 1.0:
            raise ValueError("max_shapes must be >= 1 and floor in [0, 1)")
        self.settings = settings
        self._decay = settings.decay
        self._window = settings.window
        self._max = max_shapes
        self._floor = floor
        # The steps after which the origin moves (never with decay 1).
        self._span = math.inf if settings.decay == 1.0 else _MAX_SCALE_EXP / -math.log(settings.decay)
        self._t = 0  # index of the latest request (the first is 1)
        self._origin = 0
        self._scale = 1.0  # decay**(origin - t): the stored value of a request made now
        self._pushes = itertools.count()  # heap tie-break (shapes do not compare)
        self._heaped = settings.decay < 1.0 and floor > 0.0  # with decay 1 no weight falls
        self._v: dict[api.Shape, float] = {}  # stored (scaled) weights
        self._since: dict[api.Shape, int] = {}  # first request of the shape that still counts
        self._n: dict[api.Shape, int] = {}  # requests of the shape in the window (window > 0)
        self._recent: collections.deque[tuple[int, api.Shape]] = collections.deque()
        self._heap: list[tuple[float, int, api.Shape]] = []  # (stored value, push, shape)
        self._snapshot: api.Workload | None = None
        self._snap_weights: dict[api.Shape, float] = {}
        self.count = 0
        """Requests observed."""
        self.refused = 0
        """Requests refused as not ``admissible``."""
        self.snapshots = 0
        """Snapshots taken."""

    @property
    def trusted(self) -> bool:
        """True once ``min_count`` requests were observed (and at least one shape is held)."""
        return self.count >= self.settings.min_count and bool(self._v)

    def workload(self) -> api.Workload | None:
        """The current snapshot (the same object until re-taken); None while untrusted."""
        return self._snapshot

    def live(self) -> api.Workload | None:
        """The live normalized weights (a new object per call; for tests and diagnosis)."""
        if not self._v:
            return None
        items = sorted(self._v.items(), key=lambda sv: sort_key(sv[0]))
        total = sum(v for _, v in items)
        return api.Workload(tuple(s for s, _ in items), tuple(v / total for _, v in items))

    def weights(self) -> dict[api.Shape, float]:
        """The live unnormalized weights (the latest request weighs 1)."""
        factor = 1.0 / self._scale
        return {s: v * factor for s, v in self._v.items()}

    def observe(self, shape: api.Shape) -> bool:
        """Record one request of ``shape``; True when the snapshot (``workload()``) changed.

        A shape that is not ``admissible`` is refused (``refused``): nothing changes.
        """
        if not admissible(shape):
            self.refused += 1
            return False
        if self._t + 1 - self._origin > self._span:
            self._rebase()
        self._t += 1
        t = self._t
        add = self._scale = self._decay ** (self._origin - t)
        v = self._v
        old = v.get(shape)
        if old is None:
            v[shape] = add
            self._since[shape] = t
            self._n[shape] = 1
        else:
            v[shape] = old + add
            self._n[shape] += 1
        if self._window:
            self._recent.append((t, shape))
            self._evict(t - self._window)
        if self._heaped:
            heapq.heappush(self._heap, (v[shape], next(self._pushes), shape))
            self._prune(shape)
        if len(v) > self._max:
            self._trim(shape)
        self.count += 1
        return self._resnap()

    # ----- internals

    def _rebase(self) -> None:
        """Move the origin to the latest request: stored values become the true weights."""
        factor = 1.0 / self._scale
        self._v = {s: x * factor for s, x in self._v.items()}
        self._origin = self._t
        self._scale = 1.0
        self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        self._heap = [(x, next(self._pushes), s) for s, x in self._v.items()]
        heapq.heapify(self._heap)

    def _forget(self, shape: api.Shape) -> None:
        del self._v[shape], self._since[shape], self._n[shape]

    def _evict(self, last: int) -> None:
        """Drop the requests made at or before ``last`` (they left the window)."""
        recent = self._recent
        v = self._v
        while recent and recent[0][0] <= last:
            i, s = recent.popleft()
            if s not in v or self._since[s] > i:
                continue  # the shape was forgotten since: this request counts no more
            n = self._n[s] - 1
            if n == 0:
                self._forget(s)
                continue
            self._n[s] = n
            x = v[s] - self._decay ** (self._origin - i)
            v[s] = x
            if self._heaped:
                heapq.heappush(self._heap, (x, next(self._pushes), s))

    def _prune(self, keep: api.Shape) -> None:
        """Forget the shapes whose weight fell below the floor (``keep`` weighs at least 1)."""
        heap = self._heap
        v = self._v
        threshold = self._floor * self._scale
        while heap and heap[0][0] < threshold:
            x, _, s = heapq.heappop(heap)
            if v.get(s) == x and s != keep:
                self._forget(s)
        if len(heap) > 4 * len(v) + 64:
            self._rebuild_heap()  # stale entries (superseded values) pile up with decay near 1

    def _trim(self, keep: api.Shape) -> None:
        """Forget the lightest shapes other than ``keep`` until ``max_shapes`` remain."""
        while len(self._v) > self._max:
            lightest = min((s for s in self._v if s != keep), key=lambda s: (self._v[s], self._since[s]))
            self._forget(lightest)

    def _resnap(self) -> bool:
        """Apply the snapshot rule after a request; True when a snapshot was taken."""
        if not self.trusted:
            return False
        v = self._v
        total = sum(v.values())
        drift = self.settings.drift
        if self._snapshot is not None and drift > 0.0:
            snap = self._snap_weights
            inv = 1.0 / total
            moved = 0.0
            common = 0.0
            for s, x in v.items():
                q = snap.get(s)
                if q is None:
                    moved += x * inv
                else:
                    moved += abs(x * inv - q)
                    common += q
            moved += 1.0 - common  # snapshot mass on shapes no longer held
            if 0.5 * moved < drift:
                return False
        items = sorted(v.items(), key=lambda sv: sort_key(sv[0]))
        weights = tuple(x / total for _, x in items)
        self._snapshot = api.Workload(tuple(s for s, _ in items), weights)
        self._snap_weights = dict(zip(self._snapshot.shapes, weights, strict=True))
        self.snapshots += 1
        return True
