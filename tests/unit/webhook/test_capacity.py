from __future__ import annotations

import json

import msgspec
import pytest

from gpuslice.codec import keys, registrations
from gpuslice.kube import informer, objects
from gpuslice.model import devices
from gpuslice.webhook import capacity

pytestmark = pytest.mark.unit


def registration(n: int) -> str:
    return registrations.encode_json(
        devices.GpuDevice(
            uuid=f"GPU-{i}", index=i, split_count=10, memory_mib=1000, cores=100, type="NVIDIA X"
        )
        for i in range(n)
    )


def node(name: str, cards: int | None, rv: str = "1", **extra: str) -> objects.Node:
    ann = dict(extra)
    if cards is not None:
        ann[keys.NODE_REGISTER] = registration(cards)
    return objects.Node(metadata=objects.ObjectMeta(name=name, resource_version=rv, annotations=ann))


def ev(kind: informer.EventType, n: objects.Node | None) -> informer.Event[objects.Node]:
    return informer.Event(kind, n)


def test_cards_of_annotations() -> None:
    assert capacity.cards({keys.NODE_REGISTER: registration(3)}) == 3
    assert capacity.cards({}) is None
    assert capacity.cards({keys.NODE_REGISTER: "garbage"}) is None
    assert capacity.cards({keys.NODE_REGISTER: "[]"}) is None


def test_max_follows_adds_updates_and_deletes() -> None:
    c = capacity.Cards()
    assert c.max() is None
    c.on_event(ev(informer.EventType.ADDED, node("a", 4)))
    c.on_event(ev(informer.EventType.ADDED, node("b", 8)))
    c.on_event(ev(informer.EventType.ADDED, node("cpu", None)))
    c.on_event(ev(informer.EventType.LISTED, None))
    assert c.max() == 8
    c.on_event(ev(informer.EventType.MODIFIED, node("b", 2)))
    assert c.max() == 4
    c.on_event(ev(informer.EventType.MODIFIED, node("a", None, **{keys.NODE_REGISTER: "garbage"})))
    assert c.max() == 2
    c.on_event(ev(informer.EventType.DELETED, node("b", 2)))
    assert c.max() is None
    assert c.by_node == {}


def test_trim_keeps_only_the_registration() -> None:
    full = node("a", 2, rv="7", big="x" * 1000, **{keys.NODE_LOCK: "lock"})
    trimmed = capacity.trim(full)
    assert trimmed.metadata.name == "a" and trimmed.metadata.resource_version == "7"
    assert set(trimmed.metadata.annotations) == {keys.NODE_REGISTER}
    raw = json.dumps({"metadata": {"name": "a", "resourceVersion": "3", "annotations": {"x": "y"}}}).encode()
    decoded = capacity.NODES.decoder.decode(raw)
    assert decoded == objects.Node(metadata=objects.ObjectMeta(name="a", resource_version="3"))
    assert msgspec.structs.asdict(decoded.status) == {"capacity": {}, "allocatable": {}}
