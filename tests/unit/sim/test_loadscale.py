"""The loaded replay workload: durations from the time columns, the rate for a load, the steady start."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gpuslice.sim import loadscale, trace

pytestmark = pytest.mark.unit

NAN = float("nan")


def test_duration_rules() -> None:
    creation = np.array([0.0, 10.0, 20.0, NAN, 30.0])
    deletion = np.array([100.0, NAN, 15.0, 50.0, 60.0])
    scheduled = np.array([5.0, NAN, 25.0, NAN, 20.0])
    pop = loadscale.durations(creation, deletion, scheduled, np.array([1000, 500, 300, 1000, 0]))
    # 0: scheduled 5 -> deletion 100: 95 s on a node
    # 1: no deletion: runs until the last recorded time (100): 100 - 10 = 90
    # 2: scheduled 25 after its deletion 15: max(0, 15 - 25) = 0
    # 3: no creation time: left out
    # 4: scheduled 20 before creation 30 (inconsistent): from creation, 60 - 30 = 30
    assert pop.index.tolist() == [0, 1, 2, 4]
    assert pop.duration.tolist() == [95.0, 90.0, 0.0, 30.0]
    assert pop.gpu_milli.tolist() == [1000, 500, 300, 0] and pop.untimed == 1


def _pop(gpu: list[int], life: list[float], creation: list[float] | None = None) -> loadscale.Population:
    n = len(gpu)
    return loadscale.Population(
        index=np.arange(n),
        duration=np.array(life, float),
        gpu_milli=np.array(gpu, np.int64),
        creation=np.array(creation if creation is not None else [0.0] * n, float),
        untimed=0,
    )


def test_rate_window_and_steady_start_by_hand() -> None:
    pop = _pop([1000, 500], [100.0, 200.0], [0.0, 50.0])
    # mean(g * L) = (1000 * 100 + 500 * 200) / 2 = 100000 milli-GPU-seconds per pod;
    # 4 GPUs (4000 milli) at load 0.5: lam = 0.5 * 4000 / 100000 = 0.02 pods/s
    assert loadscale.arrival_rate(pop, 4000, 0.5) == pytest.approx(0.02)
    s = loadscale.build(pop, 4000, 0.5, seed=7)
    assert s.rate == pytest.approx(0.02)
    # warm-up: 0.9 quantile of [100, 200], linear: 100 + 0.9 * (200 - 100) = 190
    # window end: 190 + 1 pass * 2 pods / 0.02 = 290
    assert s.window == pytest.approx((190.0, 290.0))
    # the trace's mean gap (50 - 0) / 1 = 50 s against ours 1 / 0.02 = 50 s: factor 1
    assert s.gap_factor == pytest.approx(1.0)
    # steady start: lam * L_i / N = 0.02 * 100 / 2 = 1 and 0.02 * 200 / 2 = 2 copies (integers: exact)
    assert s.initial == 3
    first = s.pod[: s.initial]
    assert sorted(first.tolist()) == [0, 1, 1]
    assert np.all(s.arrival[: s.initial] == 0.0)
    # remaining durations are uniform on (0, L_i)
    assert np.all(s.duration[: s.initial] <= pop.duration[first])
    later = s.arrival[s.initial :]
    assert np.all(np.diff(s.arrival) >= 0) and np.all(later > 0) and np.all(later < 290.0)
    assert np.all(s.duration[s.initial :] == pop.duration[s.pod[s.initial :]])  # arrivals keep their duration


def test_arrivals_use_every_pod_once_per_pass() -> None:
    pop = _pop([1000] * 5, [10.0, 20.0, 30.0, 40.0, 50.0])
    s = loadscale.build(pop, 100_000, 0.9, seed=3, passes=8)
    later = s.pod[s.initial :].tolist()
    full = len(later) // 5
    assert full >= 6  # about 8 passes of 5 arrivals fall in the window
    for p in range(full):
        assert sorted(later[5 * p : 5 * p + 5]) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("load", [0.8, 0.9, 0.95])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_offered_load_meets_the_target(load: float, seed: int) -> None:
    # 40 pod kinds of 1..4 whole GPUs and 30..600 s on 100 GPUs; 30 passes: about 1200 arrivals in the window
    rng = np.random.default_rng(99)
    pop = _pop(
        (1000 * rng.integers(1, 5, 40)).tolist(), rng.uniform(30.0, 600.0, 40).tolist(), list(range(40))
    )
    s = loadscale.build(pop, 100_000, load, seed, passes=30)
    offered = loadscale.offered_pct(s, pop.gpu_milli, 100_000)
    assert abs(offered - 100 * load) < 3.0


def test_offered_pct_by_hand() -> None:
    s = loadscale.Schedule(
        pod=np.array([0, 1, 0]),
        arrival=np.array([0.0, 5.0, 12.0]),
        duration=np.array([20.0, 2.0, 100.0]),
        window=(10.0, 20.0),
    )
    # 2 GPUs; in [10, 20): pod 0 (1000) over [10, 20) = 10 s; pod 1 (500) ended at 7;
    # pod 0 again over [12, 20) = 8 s -> (1000 * 10 + 1000 * 8) / (2000 * 10) = 90 %
    assert loadscale.offered_pct(s, np.array([1000, 500]), 2000) == pytest.approx(90.0)


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.51, math.nan, math.inf])
def test_load_outside_range_is_refused(bad: float) -> None:
    with pytest.raises(loadscale.ReplayError):
        loadscale.check_load(bad)


def test_load_limits_accepted() -> None:
    assert loadscale.check_load(1.5) == 1.5 and loadscale.check_load(0.01) == 0.01


def test_no_gpu_load_is_an_error() -> None:
    with pytest.raises(loadscale.ReplayError, match="no GPU load"):
        loadscale.build(_pop([0, 0], [10.0, 10.0]), 1000, 0.9, seed=1)
    with pytest.raises(loadscale.ReplayError, match="passes"):
        loadscale.build(_pop([1000], [10.0]), 1000, 0.9, seed=1, passes=0)


def test_missing_time_column_is_named(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,0,1,1000\n")
    with pytest.raises(loadscale.MissingColumnError) as err:
        loadscale.population(path, trace.load_pods(path))
    assert err.value.column == "creation_time" and "creation_time" in str(err.value)
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time\np0,1000,0,1,1000,5\n")
    with pytest.raises(loadscale.MissingColumnError) as err:
        loadscale.population(path, trace.load_pods(path))
    assert err.value.column == "deletion_time"


def test_population_reads_the_time_columns(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time,scheduled_time\n"
        "p0,1000,0,1,1000,0,100,10\n"
        "p1,1000,0,1,460,50,80,\n"
        "p2,1000,0,0,0,,90,\n"
    )
    pop = loadscale.population(path, trace.load_pods(path))
    # p0: 100 - 10 = 90; p1: 80 - 50 = 30 (not scheduled); p2: no creation time
    assert (
        pop.duration.tolist() == [90.0, 30.0] and pop.gpu_milli.tolist() == [1000, 460] and pop.untimed == 1
    )
