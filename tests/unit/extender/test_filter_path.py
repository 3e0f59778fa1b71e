"""A pod's path through /filter goes down the layers and never climbs back.

The import contracts (``pyproject.toml``) keep the framework and the policies from importing the
extender; the only way back up is a callback handed down (as the old per-pod policy wrappers were).
This traces every Python call of one filter and checks that no function of ``gpuslice.framework``
or ``gpuslice.policy`` calls a function of ``gpuslice.extender``, for every registered policy as
node and card policy, under both node-choice modes that change the path.
"""

from __future__ import annotations

import asyncio
import sys
import types
from typing import Any

import msgspec
import pytest

from gpuslice.extender import config
from gpuslice.extender.http import app as apps
from gpuslice.framework import registry
from tests.unit import builders
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit


def _layer(module: str) -> str:
    if module.startswith("gpuslice.extender"):
        return "adapter"
    if module.startswith(("gpuslice.framework", "gpuslice.policy")):
        return "core"
    return ""


def _trace_filter(policy: str, node_choice: str) -> tuple[list[tuple[str, str]], set[str]]:
    """(caller module, callee module) for every call from the core into the adapter; modules entered."""
    cache = fakes.cluster_cache(*(builders.node(f"n{i}").gpus(4, memory=16000) for i in range(3)))
    settings = config.Settings(node_choice=node_choice, node_policy=policy, card_policy=policy)
    handlers = apps.Handlers(fakes.make_deps(cache, settings=settings))
    names = ["n0", "n1", "n2"]
    asyncio.run(
        handlers.filter(msgspec.json.encode({"Pod": fakes.gpu_pod("warm", mem=4000), "NodeNames": names}))
    )
    body = msgspec.json.encode({"Pod": fakes.gpu_pod("p", mem=4000), "NodeNames": names})
    climbs: list[tuple[str, str]] = []
    entered: set[str] = set()

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        if not _layer(callee):
            return
        entered.add(callee)
        back = frame.f_back
        caller = back.f_globals.get("__name__", "") if back is not None else ""
        if _layer(caller) == "core" and _layer(callee) == "adapter":
            climbs.append((caller, callee))

    sys.setprofile(profile)
    try:
        out = asyncio.run(handlers.filter(body))
    finally:
        sys.setprofile(None)
    assert msgspec.json.decode(out)["NodeNames"], "the pod should fit somewhere"
    return climbs, entered


@pytest.mark.parametrize("node_choice", ["extender", "blend"])
@pytest.mark.parametrize("policy", registry.names(), ids=str)
def test_filter_never_calls_back_into_the_extender(policy: str, node_choice: str) -> None:
    climbs, entered = _trace_filter(policy, node_choice)
    assert climbs == []
    # the trace saw the whole path: the verb, the framework and the policy
    assert {"gpuslice.extender.http.app", "gpuslice.framework.cycle", "gpuslice.policy.batch"} <= entered


def test_the_trace_sees_a_climb_when_one_happens(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: a card rule of the policy package that calls extender code is reported."""
    from gpuslice.extender import listeners
    from gpuslice.policy import api

    # A card rule defined as if in gpuslice.policy.api that calls up into gpuslice.extender.listeners.
    namespace: dict[str, Any] = {
        "__name__": "gpuslice.policy.api",
        "_listeners": listeners,
        "_original": api.CardRule.choose_cards,
    }
    exec(  # noqa: S102 - a function whose frames name a core module, for the trace
        "def choose_cards(self, *args, **kwargs):\n"
        "    _listeners.Listeners()\n"
        "    return _original(self, *args, **kwargs)\n",
        namespace,
    )
    monkeypatch.setattr(api.CardRule, "choose_cards", namespace["choose_cards"])
    climbs, _ = _trace_filter("binpack", "extender")
    assert ("gpuslice.policy.api", "gpuslice.extender.listeners") in climbs
