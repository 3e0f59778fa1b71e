"""``gpuslice simulate --replay`` and ``--replay-policy``: records, loads, the plot, clean errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuslice import cli
from tests.unit.sim.test_cli import NODES, PODS  # the same small trace with times

pytestmark = pytest.mark.unit

KEYS = {
    "policy", "seed", "mode", "workload", "load", "offered_load_pct", "arrival_rate_per_s", "gap_factor",
    "window_seconds", "initial_pods", "untimed_pods", "unallocated_gpu_pct", "stranded_gpu_pct",
    "queued_time_pct", "queued_demand_gpu_pct", "peak_gpu_allocation_pct", "pods_arrived", "pods_waited",
    "mean_wait_seconds", "p99_wait_seconds", "max_wait_seconds", "pods_never_ran",
    "pods_rejected_queue_full", "pods_still_queued", "wall_seconds",
}  # fmt: skip


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    return ["--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")]


def test_replay_records(files: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", *files, "--replay", "--policy", "fgd,bestfit", "--seeds", "1-2", "--load", "0.8,0.95"]
    code = cli.main([*argv, "--replay-passes", "20", "--json", "--jobs", "1"])
    assert code == 0
    records = json.loads(capsys.readouterr().out)
    assert [(r["policy"], r["load"], r["seed"]) for r in records] == [
        (p, load, s) for p in ("fgd", "bestfit") for load in (0.8, 0.95) for s in (1, 2)
    ]
    for r in records:
        assert set(r) == KEYS and r["mode"] == "replay" and r["workload"] == "oracle"
        assert r["pods_arrived"] > 0 and 0 <= r["pods_never_ran"] <= r["pods_arrived"]
        assert 0.0 <= r["stranded_gpu_pct"] <= r["unallocated_gpu_pct"] <= 100.0
        assert r["window_seconds"][0] < r["window_seconds"][1]


def test_replay_online_workload(files: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["simulate", *files, "--replay", "--workload", "online", "--json", "--jobs", "1"])
    assert code == 0
    (r,) = json.loads(capsys.readouterr().out)
    assert r["workload"] == "online" and r["load"] == 0.9
    assert set(r) == KEYS | {"workload_settings"} and r["workload_settings"]["min_count"] >= 0


def test_benchmark_then_replay_table_and_plot(
    files: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    png = tmp_path / "out" / "both.png"
    argv = ["simulate", *files, "--policy", "fgd", "--seeds", "1", "--replay-policy", "bestfit,fgd"]
    code = cli.main([*argv, "--replay-seeds", "3", "--load", "0.8,0.9", "--plot", str(png), "--jobs", "1"])
    assert code == 0
    out = capsys.readouterr().out
    assert "Weng et al." in out and "Replay with departures" in out
    assert out.index("Weng et al.") < out.index("Replay with departures")
    assert png.stat().st_size > 1000


def test_benchmark_and_replay_json(files: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", *files, "--policy", "fgd", "--seeds", "1", "--replay-policy", "fgd", "--json"]
    assert cli.main([*argv, "--jobs", "1"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r.get("mode") for r in records] == [None, "replay"]


def test_replay_only_plot(files: list[str], tmp_path: Path) -> None:
    png = tmp_path / "replay.png"
    assert cli.main(["simulate", *files, "--replay", "--plot", str(png), "--jobs", "1"]) == 0
    assert png.stat().st_size > 1000


@pytest.mark.parametrize("load", ["0", "1.6", "-1", "x", ""])
def test_bad_load_is_refused(files: list[str], load: str) -> None:
    with pytest.raises(SystemExit) as err:
        cli.main(["simulate", *files, "--replay", "--load", load])
    assert err.value.code == 2


def test_trace_without_times_names_the_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,8192,1,1000\n")
    files = ["--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")]
    assert cli.main(["simulate", *files, "--replay"]) == 2
    assert "no creation_time column" in capsys.readouterr().err
    assert cli.main(["simulate", *files, "--policy", "fgd", "--replay-policy", "fgd"]) == 2
    assert "no creation_time column" in capsys.readouterr().err
