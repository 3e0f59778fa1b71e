"""The learned target workload (``shapes.ShapeHistogram``): weights, window, bounds, trust, snapshots."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.cache import cache as cache_mod
from gpuslice.cache import shapes
from gpuslice.framework import nominations
from gpuslice.model import config as model_config
from gpuslice.policy import api

pytestmark = pytest.mark.unit

A = api.Shape(0, 500, 1)
B = api.Shape(0, 1000, 1)
C = api.Shape(4000, 250, 1)
D = api.Shape(0, 1000, 2, ("V100",))


def ws(**kw: object) -> model_config.WorkloadSettings:
    """Settings that trust at once and snapshot after every request, with overrides."""
    base: dict[str, object] = {"min_count": 0, "drift": 0.0}
    base.update(kw)
    return model_config.WorkloadSettings(**base)  # type: ignore[arg-type]


def test_decay_weighs_a_request_k_back_decay_to_the_k() -> None:
    h = shapes.ShapeHistogram(ws(decay=0.5))
    for s in (A, B, A, C):
        h.observe(s)
    # requests 1..4 = A, B, A, C; at t=4: A = 0.5**3 + 0.5**1 = 0.625, B = 0.5**2 = 0.25, C = 1
    assert h.weights() == pytest.approx({A: 0.625, B: 0.25, C: 1.0})
    w = h.workload()
    assert w is not None
    # normalized by 1 + 0.625 + 0.25 = 1.875, in the fixed order (count, then share): C 250, A 500, B 1000
    assert w.shapes == (C, A, B)
    assert w.weights == pytest.approx((1 / 1.875, 0.625 / 1.875, 0.25 / 1.875))


def test_window_keeps_only_the_most_recent_requests() -> None:
    h = shapes.ShapeHistogram(ws(decay=1.0, window=3))
    for s in (A, A, B, C):
        h.observe(s)
    # window 3 at t=4 keeps requests 2..4: A once, B once, C once (request 1, an A, left)
    assert h.weights() == pytest.approx({A: 1.0, B: 1.0, C: 1.0})
    h.observe(B)
    h.observe(C)
    # t=6 keeps 4..6 = C, B, C: A's last request (2) left, so A is gone entirely
    assert h.weights() == pytest.approx({B: 1.0, C: 2.0})


def test_window_with_decay_weighs_the_window_only() -> None:
    h = shapes.ShapeHistogram(ws(decay=0.5, window=2))
    for s in (A, A, A):
        h.observe(s)
    # requests 2 and 3 count: 0.5 + 1 (request 1 would have added 0.25)
    assert h.weights() == pytest.approx({A: 1.5})


def test_untrusted_until_min_count_then_a_snapshot() -> None:
    h = shapes.ShapeHistogram(ws(min_count=3, drift=0.5))
    assert h.workload() is None
    assert h.observe(A) is False and h.workload() is None
    assert h.observe(B) is False and h.workload() is None
    # the third request makes it trusted: the first snapshot is taken whatever the drift
    assert h.observe(A) is True
    assert h.trusted and h.snapshots == 1
    w = h.workload()
    assert w is not None and w.shapes == (A, B)


def test_snapshot_is_retaken_only_past_the_drift() -> None:
    h = shapes.ShapeHistogram(ws(decay=1.0, drift=0.2))
    h.observe(A)
    first = h.workload()
    # snapshot {A: 1}; after B: live {A: 1/2, B: 1/2}, TV = (|1/2 - 1| + 1/2) / 2 = 1/2 >= 0.2: re-taken
    assert h.observe(B) is True
    second = h.workload()
    assert second is not first and second is not None
    assert second.weights == pytest.approx((0.5, 0.5))
    # after A: live {A: 2/3, B: 1/3}, TV from {1/2, 1/2} = (1/6 + 1/6) / 2 = 1/6 < 0.2: kept, same object
    assert h.observe(A) is False
    assert h.workload() is second
    # after A again: {A: 3/4, B: 1/4}, TV = (1/4 + 1/4) / 2 = 1/4 >= 0.2: re-taken
    assert h.observe(A) is True
    third = h.workload()
    assert third is not None and third.weights == pytest.approx((0.75, 0.25))
    assert h.snapshots == 3


def test_drift_zero_snapshots_after_every_request() -> None:
    h = shapes.ShapeHistogram(ws(drift=0.0))
    seen = []
    for s in (A, A, A, B):
        assert h.observe(s) is True
        seen.append(h.workload())
    assert len({id(w) for w in seen}) == 4


def test_floor_forgets_light_shapes() -> None:
    h = shapes.ShapeHistogram(ws(decay=0.5), floor=0.2)
    h.observe(A)
    h.observe(B)
    h.observe(B)
    # A: 0.5**2 = 0.25 >= 0.2, kept
    assert A in h.weights()
    h.observe(B)
    # A: 0.5**3 = 0.125 < 0.2: forgotten
    assert set(h.weights()) == {B}
    h.observe(A)
    # a new request of A starts it afresh: 1, not 1 + 0.5**4
    assert h.weights()[A] == pytest.approx(1.0)


def test_max_shapes_forgets_the_lightest_other_than_the_new_one() -> None:
    h = shapes.ShapeHistogram(ws(decay=1.0), max_shapes=2)
    h.observe(A)
    h.observe(A)
    h.observe(B)
    # {A: 2, B: 1}; C arrives: the lightest other than C is B (1 < 2)
    h.observe(C)
    assert h.weights() == {A: 2.0, C: 1.0}
    # D arrives: C (1) goes; were the weights tied, the shape held the longest would go first
    h.observe(D)
    assert h.weights() == {A: 2.0, D: 1.0}


def test_max_shapes_ties_go_to_the_shape_held_longest() -> None:
    h = shapes.ShapeHistogram(ws(decay=1.0), max_shapes=2)
    h.observe(A)
    h.observe(B)
    h.observe(C)  # A and B weigh 1 each; A was held first
    assert set(h.weights()) == {B, C}


def test_cache_snapshot_carries_the_histogram_snapshot() -> None:
    c = cache_mod.ClusterCache(
        shapes.ShapeHistogram(ws(min_count=2, drift=0.3)), nominator=nominations.Nominator()
    )
    c.observe_request(A)
    assert c.snapshot().workload is None  # one request < min_count
    c.observe_request(A)
    first = c.snapshot().workload
    assert first is not None
    c.observe_request(A)  # live is still {A: 1}: TV 0
    assert c.snapshot().workload is first


def test_settings_are_checked_with_the_setting_named() -> None:
    with pytest.raises(model_config.WorkloadSettingError) as err:
        shapes.ShapeHistogram(model_config.WorkloadSettings(decay=0.0))
    assert err.value.setting == "workload_decay"
    with pytest.raises(ValueError, match="max_shapes"):
        shapes.ShapeHistogram(max_shapes=0)


def test_rebasing_keeps_the_weights() -> None:
    # decay 0.5 moves the origin every ~865 requests; 3000 alternating A, B requests ending with B:
    # B = 1 + 0.25 + 0.0625 + ... = 4/3, A = 0.5 + 0.125 + ... = 2/3
    h = shapes.ShapeHistogram(ws(decay=0.5))
    for k in range(3000):
        h.observe(A if k % 2 == 0 else B)
    assert h.weights() == pytest.approx({A: 2 / 3, B: 4 / 3})


def test_total_variation() -> None:
    p = api.Workload((A, B), (0.5, 0.5))
    q = api.Workload((B, C), (0.75, 0.25))
    # |0.5 - 0| + |0.5 - 0.75| + |0 - 0.25| = 1, halved
    assert shapes.total_variation(p, q) == pytest.approx(0.5)
    assert shapes.total_variation(p, p) == 0.0
    assert shapes.total_variation(p, None) == 1.0


# ----------------------------------------------------------------------------- against a naive model


class Naive:
    """The module docstring's rules, recomputed from the whole request list at every step."""

    def __init__(self, s: model_config.WorkloadSettings, max_shapes: int, floor: float) -> None:
        self.s = s
        self.max = max_shapes
        self.floor = floor
        self.seq: list[api.Shape] = []
        self.since: dict[api.Shape, int] = {}
        self.snap: dict[api.Shape, float] | None = None

    def weight(self, x: api.Shape) -> float:
        t = len(self.seq)
        lo = max(self.since[x], t - self.s.window + 1 if self.s.window else 1)
        return sum(self.s.decay ** (t - i) for i in range(lo, t + 1) if self.seq[i - 1] == x)

    def in_window(self, x: api.Shape) -> bool:
        t = len(self.seq)
        lo = max(self.since[x], t - self.s.window + 1 if self.s.window else 1)
        return any(self.seq[i - 1] == x for i in range(lo, t + 1))

    def observe(self, shape: api.Shape) -> bool:
        self.seq.append(shape)
        self.since.setdefault(shape, len(self.seq))
        for x in [x for x in self.since if not self.in_window(x)]:
            del self.since[x]
        w = {x: self.weight(x) for x in self.since}
        for x in [x for x in w if x != shape and w[x] < self.floor]:
            del self.since[x], w[x]
        while len(w) > self.max:
            x = min((x for x in w if x != shape), key=lambda x: (w[x], self.since[x]))
            del self.since[x], w[x]
        self.w = w
        if len(self.seq) < self.s.min_count:
            return False
        total = sum(w.values())
        live = {x: v / total for x, v in w.items()}
        if self.snap is not None and self.s.drift > 0:
            keys = set(live) | set(self.snap)
            tv = 0.5 * sum(abs(live.get(x, 0.0) - self.snap.get(x, 0.0)) for x in keys)
            if tv < self.s.drift:
                return False
        self.snap = live
        return True


SHAPES = [A, B, C, D, api.Shape(0, 100, 1), api.Shape(8000, 1000, 8)]


@settings(max_examples=150, deadline=None)
@given(
    seq=st.lists(st.sampled_from(SHAPES), max_size=80),
    decay=st.sampled_from([0.5, 0.9, 0.99, 1.0]),
    window=st.sampled_from([0, 1, 3, 10]),
    min_count=st.sampled_from([0, 1, 5, 30]),
    drift=st.sampled_from([0.0, 0.0731, 0.2113]),
    max_shapes=st.sampled_from([1, 2, 4, 64]),
    floor=st.sampled_from([0.0, 1e-3, 0.2]),
    scale_exp=st.sampled_from([600.0, 3.0]),
)
def test_constant_time_histogram_equals_naive_recomputation(
    seq: list[api.Shape],
    decay: float,
    window: int,
    min_count: int,
    drift: float,
    max_shapes: int,
    floor: float,
    scale_exp: float,
) -> None:
    s = model_config.WorkloadSettings(decay=decay, window=window, min_count=min_count, drift=drift)
    old = shapes._MAX_SCALE_EXP
    shapes._MAX_SCALE_EXP = scale_exp  # 3: the origin moves every few requests (decay < 1)
    try:
        h = shapes.ShapeHistogram(s, max_shapes=max_shapes, floor=floor)
    finally:
        shapes._MAX_SCALE_EXP = old
    ref = Naive(s, max_shapes, floor)
    for shape in seq:
        assert h.observe(shape) == ref.observe(shape)
        got = h.weights()
        assert set(got) == set(ref.w)
        assert got == pytest.approx(ref.w, rel=1e-9, abs=1e-12)
        w = h.workload()
        if ref.snap is None:
            assert w is None
        else:
            assert w is not None
            assert dict(zip(w.shapes, w.weights, strict=True)) == pytest.approx(ref.snap, rel=1e-9)
            assert list(w.shapes) == sorted(w.shapes, key=shapes.sort_key)
