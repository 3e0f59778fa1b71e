"""``gpuslice explain`` through the e2e cluster: the running extender's ``/explain`` and the CLI
reading the cluster with the kubeconfig explain a pending pod alike, naming the largest free card.

The pod asks more memory per card than any card of the cluster has (A100s register 81920 MiB),
so it stays pending whatever other tests left bound; it is deleted at the end.
"""

from __future__ import annotations

import contextlib
import io
import re
import urllib.parse
import urllib.request

import pytest

from gpuslice import explaincli
from gpuslice.framework import explain
from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e

ASK_MIB = 90000


def cli_json(argv: list[str]) -> explain.Explanation:
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    with contextlib.redirect_stdout(out):
        code = explaincli.run([*argv, "--json"])
        out.flush()
    assert code == 0
    return explain.decode(out.buffer.getvalue())


def test_cli_and_extender_explain_a_pending_pod_alike(e2e_cluster: Cluster) -> None:
    ns = e2e_cluster.namespace("explain")
    name = "too-big"
    e2e_cluster.create_pod(ns, name, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(ASK_MIB)})
    try:
        e2e_cluster.wait_event(ns, name, "FilteringFailed")
        query = urllib.parse.urlencode({"pod": f"{ns}/{name}"})
        with urllib.request.urlopen(f"{e2e_cluster.ext.url}/explain?{query}", timeout=10) as resp:
            assert resp.status == 200
            routed = explain.decode(resp.read())
        live = cli_json([f"{ns}/{name}", "--kubeconfig", str(e2e_cluster.cp.kubeconfig)])
        via_extender = cli_json([f"{ns}/{name}", "--extender", e2e_cluster.ext.url])
        assert via_extender == routed
        assert live == routed, (live, routed)

        assert routed.feasible == () and routed.asks[0].memory_mib == ASK_MIB
        cards = [(c.memory_free_mib, n.name, c.index) for n in routed.nodes for c in n.cards]
        assert cards, routed
        free = max(c[0] for c in cards)
        match = re.fullmatch(
            rf"needs {ASK_MIB} MiB per card, largest free is (\d+) MiB on (\S+) card (\d+)"
            r", a card of \d+ MiB",
            routed.change,
        )
        assert match, routed.change
        assert int(match.group(1)) == free
        said = next(n for n in routed.nodes if n.name == match.group(2))
        assert any(c.index == int(match.group(3)) and c.memory_free_mib == free for c in said.cards)
        assert all(
            c.reason == "InsufficientGPUMemory"
            for n in routed.nodes
            for c in n.cards
            if c.memory_total_mib < ASK_MIB
        )
    finally:
        e2e_cluster.delete_pod(ns, name)
