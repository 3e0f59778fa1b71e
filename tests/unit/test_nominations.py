"""framework.nominations.Nominator alone: its records, rules and change tracking (docs/preemption.md)."""

from __future__ import annotations

import pytest

from gpuslice.framework import nominations
from gpuslice.model import nodes
from tests.unit.builders import alloc, uuid

pytestmark = pytest.mark.unit

CARD0, CARD1 = uuid("n", 0), uuid("n", 1)
WHOLE0 = alloc("n", ((CARD0, 80000, 100),))
HALF1 = alloc("n", ((CARD1, 40000, 50),))


def test_unclaimed_nominations_are_held_for_everyone_but_their_preemptor() -> None:
    n = nominations.Nominator()
    n.nominate("ns/a", "u-a", WHOLE0, expires_at=10.0)
    n.nominate("ns/b", "u-b", HALF1, expires_at=10.0)
    assert n.held() == {"n": {CARD0: nodes.CardUsage(1, 80000, 100), CARD1: nodes.CardUsage(1, 40000, 50)}}
    assert n.held(skip="ns/a") == {"n": {CARD1: nodes.CardUsage(1, 40000, 50)}}
    assert n.unclaimed_node("ns/a") == "n" and n.unclaimed_node("ns/none") is None
    assert n.held_against("n", "ns/a", "u-a") == {CARD1: nodes.CardUsage(1, 40000, 50)}
    assert n.held_against("n", "ns/a", "u-recreated") == n.held()["n"]  # same name, other pod
    assert n.held_against("m", "ns/x", "u-x") == {}


def test_a_claimed_nomination_leaves_the_snapshots_but_not_the_assumes_of_others() -> None:
    n = nominations.Nominator()
    n.nominate("ns/a", "u-a", WHOLE0, expires_at=10.0)
    assert not n.claim("ns/a", "u-wrong") and n.claim("ns/a", "u-a") and n.claim("ns/a", "u-a")
    assert n.held() == {} and n.unclaimed_node("ns/a") is None
    assert n.held_against("n", "ns/other", "u-o") == {CARD0: nodes.CardUsage(1, 80000, 100)}
    assert n.held_against("n", "ns/a", "u-any") == {}
    nom = n.nomination("ns/a")
    assert nom is not None and nom.claimed and nom.alloc == WHOLE0 and nom.expires_at == 10.0


def test_take_release_expire_and_drop_node_end_nominations() -> None:
    n = nominations.Nominator()
    n.nominate("ns/a", "u-a", WHOLE0, expires_at=10.0)
    n.nominate("ns/b", "u-b", HALF1, expires_at=20.0)
    n.nominate("ns/c", "u-c", alloc("m", (("GPU-m-0", 1000, 0),)), expires_at=30.0)
    assert not n.take("ns/a", "u-other") and n.take("ns/a", "u-a") and n.nomination("ns/a") is None
    assert n.expire(19.0) == () and n.expire(20.0) == ("ns/b",)
    assert [x.key for x in n.nominations()] == ["ns/c"]
    n.drop_node("m")
    assert n.nominations() == () and not n.release("ns/c")
    n.nominate("ns/d", "u-d", WHOLE0, expires_at=1.0)
    assert n.release("ns/d") and not n.release("ns/d")


def test_every_change_bumps_the_version_and_names_its_nodes() -> None:
    n = nominations.Nominator()
    v0 = n.version()
    n.nominate("ns/a", "u-a", WHOLE0, expires_at=10.0)
    v1 = n.version()
    assert v1 > v0 and n.changed_since(v0) == ("n",)
    n.nominate("ns/a", "u-a", alloc("m", (("GPU-m-0", 1000, 0),)), expires_at=10.0)  # moved: both nodes
    assert n.changed_since(v1) == ("m", "n")
    v2 = n.version()
    assert not n.claim("ns/a", "u-x") and n.version() == v2  # nothing changed
    assert n.changed_since(v2) == ()
    n.claim("ns/a", "u-a")
    assert n.changed_since(v2) == ("m",)
