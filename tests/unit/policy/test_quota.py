"""QuotaView: limits per namespace, usage counted per card."""

from __future__ import annotations

import pytest

from gpuslice.policy import quota

pytestmark = pytest.mark.unit

Q = quota.QuotaView

CASES = [
    # (id, view, (count, memory, cores) to add, admitted)
    ("unlimited", Q(), (8, 10**9, 800), True),
    # 2 cards x 1000 MiB = 2000 on top of 3000 used: 5000 <= 5000
    ("memory-at-limit", Q(memory_limit=5000, used_memory=3000), (2, 2000, 0), True),
    ("memory-over", Q(memory_limit=5000, used_memory=3001), (2, 2000, 0), False),
    # 30 + 2 x 40 = 110 > 100
    ("cores-over", Q(cores_limit=100, used_cores=30), (2, 0, 80), False),
    ("count-over", Q(count_limit=2, used_count=1), (2, 0, 0), False),
    # a limit of 0 blocks everything, even a request adding nothing to it
    ("zero-blocks", Q(memory_limit=0), (1, 0, 0), False),
    ("other-limits-unset", Q(cores_limit=50), (4, 10**6, 50), True),
]


@pytest.mark.parametrize(("view", "add", "ok"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_admits(view: quota.QuotaView, add: tuple[int, int, int], ok: bool) -> None:
    assert view.admits(*add) is ok


def test_plus_and_cleared() -> None:
    v = Q(memory_limit=10).plus(1, 4, 20).plus(1, 4, 20)
    assert (v.used_count, v.used_memory, v.used_cores) == (2, 8, 40)
    assert v.cleared() == Q(memory_limit=10)
    assert Q().unlimited
    assert not v.unlimited
