"""``gpuslice simulate``: the JSON contract, table output, plot, replay, and variant trace files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuslice import cli
from gpuslice.sim import cli as sim_cli

pytestmark = pytest.mark.unit

NODES = """sn,cpu_milli,memory_mib,gpu,model
n0,32000,131072,2,T4
n1,64000,262144,4,G2
n2,8000,32768,1,V100M16
"""

PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,\
creation_time,deletion_time,scheduled_time
p0,4000,8192,1,1000,,LS,Running,0,100,0
p1,2000,4096,1,470,,LS,Running,10,50,10
p2,2000,4096,1,470,,LS,Running,20,200,20
p3,16000,16384,0,0,,BE,Running,30,40,30
p4,8000,8192,2,1000,G2,LS,Running,40,300,40
p5,3000,4096,1,810,,LS,Running,45,90,45
p6,12000,8192,1,1000,,LS,Running,60,70,60
"""

PODS_5COL = """name,cpu_milli,memory_mib,num_gpu,gpu_milli
p0,4000,8192,1,1000
p1,2000,4096,1,470
p2,2000,4096,4,1000
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    return tmp_path / "nodes.csv", tmp_path / "pods.csv"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().out


def test_json_contract(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = files
    code, out = run(
        capsys, "simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd,bestfit",
        "--seeds", "1-2", "--tune", "1.3", "--json", "--jobs", "1",
    )  # fmt: skip
    assert code == 0
    records = json.loads(out)
    assert [(r["policy"], r["seed"]) for r in records] == [
        ("fgd", 1),
        ("fgd", 2),
        ("bestfit", 1),
        ("bestfit", 2),
    ]
    for r in records:
        assert set(r) == {
            "policy",
            "seed",
            "unallocated_gpu_pct",
            "pods_arrived",
            "pods_failed",
            "wall_seconds",
        }
        assert set(r["unallocated_gpu_pct"]) == {"100", "130"}
        assert 0.0 <= r["unallocated_gpu_pct"]["100"] <= 100.0
        # 7 GPUs; demand 1 + .47 + .47 + 2 + .81 + 1 = 5.75 GPUs < 1.3 * 7 -> inflated
        assert r["pods_arrived"] > 7 and 0 <= r["pods_failed"] <= r["pods_arrived"]


def test_table_and_plot(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    nodes, pods = files
    png = tmp_path / "out" / "curve.png"
    code, out = run(
        capsys, "simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "dotprod",
        "--seeds", "3", "--plot", str(png), "--jobs", "1",
    )  # fmt: skip
    assert code == 0
    assert "dotprod" in out and "Weng et al." in out
    assert png.stat().st_size > 1000


def test_online_table_says_where_the_workload_came_from(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = files
    args = ("simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd", "--seeds", "3")
    code, out = run(capsys, *args, "--workload", "online", "--jobs", "1")
    assert code == 0 and "learned online" in out and "paper (oracle)" in out
    code, out = run(capsys, *args, "--jobs", "1")
    assert code == 0 and "the paper's oracle" in out and "learned online" not in out


def test_five_column_variant_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS_5COL)
    code, out = run(
        capsys, "simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv"),
        "--policy", "packing", "--seeds", "1", "--json", "--jobs", "1",
    )  # fmt: skip
    assert code == 0 and json.loads(out)[0]["policy"] == "packing"


def test_bad_trace_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nodes.csv").write_text("name,cpu\nx,1\n")
    code = cli.main(["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--json"])
    assert code == 2 and "missing columns" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [("42-45", [42, 43, 44, 45]), ("1,3", [1, 3]), ("1-2,7", [1, 2, 7]), ("5", [5])],
    ids=["range", "list", "mixed", "single"],
)
def test_parse_seeds(text: str, expected: list[int]) -> None:
    assert sim_cli.parse_seeds(text) == expected


def test_unknown_policy_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--policy", "nope"])
    assert "unknown policy" in capsys.readouterr().err


def test_mig_runs_every_variant_on_the_same_arrivals(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(
        capsys, "simulate", "--mig", "synthetic", "--seeds", "1", "--mig-nodes", "2",
        "--mig-arrivals", "100", "--mig-warmup", "10", "--json", "--jobs", "1",
    )  # fmt: skip
    assert code == 0
    records = json.loads(out)
    assert [r["variant"] for r in records] == ["hami", "hami-binpack", "gpuslice", "ideal", "lowest-first"]
    for r in records:
        assert r["accepted"] + r["rejected"] == r["arrivals"] == 100, r
        assert [a for a, _ in r["by_kind"]] == [a for a, _ in records[0]["by_kind"]]  # same arrivals
