"""The bind flow's and the app's safety settings are required: a wiring that forgets one fails.

Only the leader binds, never from a partial cache, and only after the truth check; filter and
prioritize answer only once synced. These used to default to "open" (``lambda: True``, a trusting
truth check), so a second composition root that forgot one would bind on every replica from
whatever the cache held, with no error. Now construction raises ``TypeError`` instead (and mypy
reports the missing argument before anything runs).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpuslice.extender.binding import bind as binds
from gpuslice.extender.http import app as apps
from tests.unit.builders import node
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

FLOW_GATES = ("truth", "leading", "synced", "excluded", "lock_owner")
APP_GATES = ("synced", "follower", "follower_ready", "excluded")


def _arguments(obj: Any) -> dict[str, Any]:
    """The constructor arguments that rebuild ``obj`` (a dataclass), its private state left out."""
    return {
        f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init and not f.name.startswith("_")
    }


@pytest.fixture
def deps() -> apps.Deps:
    return fakes.make_deps(fakes.cluster_cache(node("n1").gpus(1)))


def test_with_every_setting_both_construct(deps: apps.Deps) -> None:
    assert isinstance(binds.BindFlow(**_arguments(deps.flow)), binds.BindFlow)
    assert isinstance(apps.Deps(**_arguments(deps)), apps.Deps)


@pytest.mark.parametrize("gate", FLOW_GATES)
def test_a_bind_flow_without_a_safety_setting_is_a_type_error(deps: apps.Deps, gate: str) -> None:
    arguments = _arguments(deps.flow)
    del arguments[gate]
    with pytest.raises(TypeError, match=gate):
        binds.BindFlow(**arguments)


@pytest.mark.parametrize("gate", APP_GATES)
def test_app_deps_without_a_safety_setting_are_a_type_error(deps: apps.Deps, gate: str) -> None:
    arguments = _arguments(deps)
    del arguments[gate]
    with pytest.raises(TypeError, match=gate):
        apps.Deps(**arguments)


def test_both_take_keywords_only(deps: apps.Deps) -> None:
    """Keyword-only, so adding a gate can never shift a positional argument into its place."""
    with pytest.raises(TypeError):
        binds.BindFlow(*_arguments(deps.flow).values())  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        apps.Deps(*_arguments(deps).values())  # type: ignore[call-arg]
