from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from gpuslice import cli
from gpuslice.model import allocations, nodes, requests
from gpuslice.policy import decisions
from gpuslice.sim import shadowreport as sr
from tests.unit.builders import alloc, node, pod, uuid

pytestmark = pytest.mark.unit

# Two nodes of one card each. Live (recorded): p1 (60 %) on b, p2 (50 %) on a with only a offered.
# binpack in shadow puts p1 on a (an empty-node tie goes to the lower name), and then p2, offered a
# only, no longer fits there: it cannot place it.
MEM = 81920


def _pct(name: str, pct: int) -> requests.PodRequest:
    return pod(name).uid(f"uid-{name}").gpu(1, pct=pct, cores=pct).obj()


def _grant(node_name: str, pct: int) -> allocations.PodAllocation:
    return alloc(node_name, ((uuid(node_name, 0), MEM * pct // 100, pct),))


def _start(shadows: tuple[str, ...] = ("binpack",)) -> decisions.Start:
    states = (node("a").gpus(1).state(), node("b").gpus(1).state())
    return decisions.Start(
        time=1.0,
        node_policy="binpack",
        card_policy="spread",
        shadow_policies=shadows,
        fallback="binpack",
        nodes=states,
    )


def _decision(
    name: str, pct: int, live: str, candidates: tuple[str, ...] | None = None
) -> decisions.Decision:
    return decisions.Decision(
        time=2.0,
        key=f"default/{name}",
        uid=f"uid-{name}",
        request=_pct(name, pct),
        candidates=candidates,
        node=live,
        allocation=_grant(live, pct),
    )


def _record() -> list[decisions.Record]:
    return [_start(), _decision("p1", 60, "b"), _decision("p2", 50, "a", ("a",))]


def test_live_column_applies_the_recorded_choices() -> None:
    report = sr.replay(_record())
    live, binpack = report.results
    assert live.live and live.policy == "binpack"
    assert (live.placed, live.unplaced) == (2, 0)
    assert live.placements == {"uid-p1": ("b", ((uuid("b", 0),),)), "uid-p2": ("a", ((uuid("a", 0),),))}
    assert (live.node_agreement, live.card_agreement) == (1.0, 1.0)
    # 400 + 500 milli free of 2000.
    assert live.unallocated_pct == pytest.approx(45.0)
    assert live.free_gpus == 0


def test_shadow_places_in_order_and_counts_what_it_cannot_place() -> None:
    _, binpack = sr.replay(_record()).results
    assert not binpack.live and binpack.policy == "binpack"
    assert binpack.placements["uid-p1"] == ("a", ((uuid("a", 0),),))
    assert binpack.placements["uid-p2"] == ("", ())
    assert (binpack.placed, binpack.unplaced) == (1, 1)
    assert (binpack.node_agreement, binpack.card_agreement) == (0.0, 0.0)
    assert binpack.online_node_agreement is None  # nothing recorded online
    assert binpack.unallocated_pct == pytest.approx(70.0)  # 400 + 1000 of 2000
    assert binpack.free_gpus == 1


def test_departures_free_capacity_in_every_copy() -> None:
    records = [
        *_record()[:2],
        decisions.Departure(time=3.0, key="default/p1", uid="uid-p1"),
        _decision("p2", 50, "a", ("a",)),
    ]
    report = sr.replay(records)
    live, binpack = report.results
    assert report.departures == 1
    assert binpack.placements["uid-p2"] == ("a", ((uuid("a", 0),),))  # p1 left a: p2 fits now
    assert binpack.unallocated_pct == pytest.approx(75.0) and live.unallocated_pct == pytest.approx(75.0)
    assert (binpack.node_agreement, binpack.card_agreement) == (0.5, 0.5)


def test_fragmentation_against_the_recorded_workload() -> None:
    # Live holds a half card on a; b is idle. Recorded shapes: 500 milli (2 pods), 1000 milli (1).
    records: list[decisions.Record] = [
        _start(()),
        _decision("p1", 50, "a"),
        _decision("p2", 50, "b"),
        decisions.Departure(time=3.0, key="default/p2", uid="uid-p2"),
        _decision("p3", 100, "b"),
        decisions.Departure(time=3.0, key="default/p3", uid="uid-p3"),
    ]
    (live,) = sr.replay(records).results
    # a's free 500 milli is a fragment for the whole-card shape (weight 1/3) only.
    assert live.fragmentation_pct == pytest.approx(100 * (500 / 3) / 2000, abs=1e-3)
    assert live.unallocated_pct == pytest.approx(75.0)
    assert live.free_gpus == 1


def test_online_agreement_comes_from_the_recorded_choices() -> None:
    d1 = msgspec.structs.replace(
        _decision("p1", 60, "b"),
        shadows=(decisions.Choice(policy="binpack", node="a", cards=((uuid("a", 0),),), agreement="none"),),
    )
    d2 = msgspec.structs.replace(
        _decision("p2", 50, "a", ("a",)),
        shadows=(decisions.Choice(policy="binpack", node="a", cards=((uuid("a", 0),),), agreement="cards"),),
    )
    _, binpack = sr.replay([_start(), d1, d2]).results
    assert (binpack.online_node_agreement, binpack.online_card_agreement) == (0.5, 0.5)


def test_a_restart_resets_every_copy_to_its_state() -> None:
    used = nodes.NodeState(inventory=node("a").gpus(1).inventory(), usage=(nodes.CardUsage(1, MEM // 2, 50),))
    restart = msgspec.structs.replace(_start(), nodes=(used, node("b").gpus(1).state()))
    report = sr.replay([*_record(), restart, _decision("p4", 50, "a")])
    assert report.restarts == 1
    live = report.results[0]
    assert live.unallocated_pct == pytest.approx(50.0)  # a full, b idle: the restart's state plus p4


def _write(path: Path, records: list[decisions.Record]) -> None:
    enc = msgspec.json.Encoder()
    path.write_bytes(b"".join(enc.encode(r) + b"\n" for r in records))


def test_command_prints_json_and_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps to the terminal width
    path = tmp_path / "rec.jsonl"
    _write(path, _record())
    assert cli.main(["shadow", "report", "--from", str(path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["decisions"] == 2 and got["live_policy"] == "binpack"
    assert [p["policy"] for p in got["policies"]] == ["binpack", "binpack"]
    assert got["pods"][0] == {
        "key": "default/p1",
        "uid": "uid-p1",
        "placements": {
            "live": {"node": "b", "cards": [[uuid("b", 0)]]},
            "binpack": {"node": "a", "cards": [[uuid("a", 0)]]},
        },
    }
    assert cli.main(["shadow", "report", "--from", str(path)]) == 0
    table = capsys.readouterr().out
    assert "binpack (live)" in table and "45.00 %" in table


def test_command_reports_unreadable_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["shadow", "report", "--from", str(tmp_path / "missing.jsonl")]) == 1
    assert "gpuslice shadow report:" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "nope"}\n')
    assert cli.main(["shadow", "report", "--from", str(bad)]) == 1
    assert "line 1: not a shadow record" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert cli.main(["shadow", "report", "--from", str(empty)]) == 1
    assert "no start record" in capsys.readouterr().err
