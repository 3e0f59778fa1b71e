"""The agent's HTTP routes, its metrics, and ``gpuslice agent --once --dry-run`` over fake shapes."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request

import pytest

from gpuslice import cli as top_cli
from gpuslice.agent import cli, metrics, server
from gpuslice.codec import keys, node_inventory
from gpuslice.model import devices, nodes

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "address"),
    [("127.0.0.1:9400", ("127.0.0.1", 9400)), (":9400", ("", 9400)), ("[::1]:0", ("::1", 0))],
    ids=["v4", "any", "v6"],
)
def test_parse_listen(text: str, address: tuple[str, int]) -> None:
    assert server.parse_listen(text) == address


@pytest.mark.parametrize("text", ["9400", "host:", "host:70000", "host:x"])
def test_parse_listen_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        server.parse_listen(text)


def _get(url: str, method: str = "GET") -> tuple[int, str]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_routes() -> None:
    m = metrics.AgentMetrics()
    card = devices.GpuDevice(uuid="GPU-a", index=0, type="NVIDIA L40S", memory_mib=46068)
    m.update_cards([card], [nodes.CardTelemetry(uuid="GPU-a", utilization_pct=50.0)], {"GPU-a": 46068})
    refreshes: list[int] = []
    s = server.AgentServer(("127.0.0.1", 0), m.render, lambda: refreshes.append(1), lambda: (True, "ok"))
    s.start()
    try:
        base = f"http://127.0.0.1:{s.port}"
        code, body = _get(base + "/metrics")
        assert code == 200
        assert 'gpuslice_agent_gpu_utilization_ratio{index="0",model="NVIDIA L40S",uuid="GPU-a"} 0.5' in body
        assert 'gpuslice_agent_gpu_healthy{index="0",model="NVIDIA L40S",uuid="GPU-a"} 1.0' in body
        labels = '{index="0",model="NVIDIA L40S",uuid="GPU-a"}'
        assert f"gpuslice_agent_gpu_memory_total_bytes{labels} 4.8305799168e+10" in body  # 46068 MiB
        assert _get(base + "/healthz") == (200, "ok\n")
        assert _get(base + "/refresh", "POST")[0] == 202
        assert refreshes == [1]
        assert _get(base + "/nope")[0] == 404
    finally:
        s.stop()


def test_cards_that_vanish_lose_their_series() -> None:
    m = metrics.AgentMetrics()
    a = devices.GpuDevice(uuid="GPU-a", index=0, type="T")
    b = devices.GpuDevice(uuid="GPU-b", index=1, type="T")
    m.update_cards([a, b], [], {})
    m.update_cards([a], [], {})
    body = m.render()[0].decode()
    assert 'uuid="GPU-a"' in body and 'uuid="GPU-b"' not in body


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    code = cli.main(p.parse_args(argv))
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "shape", ["h100-8", "a100-8-2numa", "t4-4", "a40-2", "l40s-2", "h100-8-mig", "a100-80g-4-mixed"]
)
def test_once_dry_run(shape: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli(
        ["--once", "--dry-run", "--register", "--node-name", "n1", "--backend", f"fake:{shape}"], capsys
    )
    assert code == 0 and out["error"] is None
    ann = out["annotations"]
    assert isinstance(ann, dict)
    assert set(ann) == {keys.NODE_REGISTER, keys.NODE_PAIR_SCORE, keys.GPU_TOPOLOGY, keys.GPU_TELEMETRY}
    inv = node_inventory.decode_node("n1", ann)
    assert inv.topology is not None and len(inv.telemetry) == len(inv.devices) > 0


def test_once_with_split_and_scaling(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--once", "--dry-run", "--register", "--node-name", "n1", "--backend", "fake:t4-4"]
    code, out = run_cli(
        [*argv, "--split-count", "4", "--memory-scaling", "2", "--core-scaling", "1.5"], capsys
    )
    ann = out["annotations"]
    assert isinstance(ann, dict)
    d = node_inventory.decode_node("n1", ann).devices[0]
    assert (d.split_count, d.memory_mib, d.cores, d.type) == (
        4,
        30720,
        150,
        "NVIDIA-Tesla T4",
    )  # 15360 x 2; 100 x 1.5


def test_once_with_a_mig_allowlist(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--once", "--dry-run", "--register", "--node-name", "n1", "--backend", "fake:a100-80g-4-mixed"]
    code, out = run_cli(
        [*argv, "--mig-profiles", "A30=1g.6gb", "--mig-profiles", "A100=1g.10gb, 3g.40gb"], capsys
    )
    ann = out["annotations"]
    assert code == 0 and isinstance(ann, dict)
    cards = node_inventory.decode_node("n1", ann).devices
    assert [d.mode for d in cards] == [
        devices.MODE_MIG,
        devices.MODE_MIG,
        devices.MODE_HAMI_CORE,
        devices.MODE_HAMI_CORE,
    ]
    assert [p.name for p in cards[0].mig_profiles] == ["1g.10gb", "3g.40gb"]


@pytest.mark.parametrize("spec", ["A100", "A100=", "=1g.5gb", "A100=5gb"])
def test_bad_mig_allowlist(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    assert cli.main(p.parse_args(["--once", "--dry-run", "--node-name", "n", "--mig-profiles", spec])) == 2
    assert "mig" in capsys.readouterr().err.lower()


def test_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    assert cli.main(p.parse_args(["--once", "--dry-run", "--node-name", "n", "--split-count", "0"])) == 2
    assert "split count" in capsys.readouterr().err


def test_registered_as_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    code = top_cli.main(["agent", "--once", "--dry-run", "--node-name", "n1", "--backend", "fake:none"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["annotations"] == {}
