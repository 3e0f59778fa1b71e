"""The leader's pod label in ``lease`` mode: the writer's rules, the settings, the wiring in ``serve``."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from gpuslice.extender import config, serve
from gpuslice.extender.binding import leader, leaderlabel
from gpuslice.framework import logs
from gpuslice.kube import errors as kerrors

pytestmark = pytest.mark.unit


class FakePod:
    """The pod's label as the writes leave it; ``fail`` makes the next writes fail."""

    def __init__(self, labelled: bool = False) -> None:
        self.labelled = labelled
        self.writes: list[bool] = []
        self.fail = 0
        self.hang = False

    async def write(self, leading: bool) -> None:
        self.writes.append(leading)
        if self.hang:
            await asyncio.sleep(3600)
        if self.fail:
            self.fail -= 1
            raise kerrors.ApiUnavailable("PATCH pod: connection refused")
        self.labelled = leading


async def _until(condition: object, timeout_s: float = 2.0) -> bool:
    assert callable(condition)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_a_stale_label_is_removed_at_start_then_follows_leadership() -> None:
    pod = FakePod(labelled=True)  # the previous container of this pod led
    label = leaderlabel.PodLabel(pod.write, "ns/p", retry_s=0.01)
    async with label.running():
        assert await _until(lambda: pod.writes == [False])
        assert pod.labelled is False and label.shown is False
        label.want(True)
        assert await _until(lambda: pod.labelled is True)
        label.want(False)
        assert await _until(lambda: pod.labelled is False)
        await asyncio.sleep(0.05)
        assert pod.writes == [False, True, False]  # no write while the pod shows the wish


async def test_a_leader_from_the_start_writes_the_label_once() -> None:
    pod = FakePod()
    label = leaderlabel.PodLabel(pod.write, "ns/p", retry_s=0.01)
    label.want(True)  # the Lease came back before the writer's first pass
    async with label.running():
        assert await _until(lambda: pod.labelled is True)
        await asyncio.sleep(0.05)
        assert pod.writes == [True]
    assert pod.labelled is False and pod.writes == [True, False]  # the end of `running` removed it


async def test_failed_writes_are_logged_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    pod = FakePod()
    pod.fail = 3
    label = leaderlabel.PodLabel(pod.write, "ns/p", retry_s=0.01)
    label.want(True)
    with caplog.at_level(logging.WARNING, logger="gpuslice.extender.binding.leaderlabel"):
        async with label.running():
            assert await _until(lambda: pod.labelled is True)
    assert pod.writes[:4] == [True, True, True, True]
    failures = [r for r in caplog.records if "cannot set gpuslice.io/leader on pod ns/p" in r.getMessage()]
    assert len(failures) == 3


async def test_want_never_waits_for_the_apiserver() -> None:
    pod = FakePod()
    pod.hang = True
    label = leaderlabel.PodLabel(pod.write, "ns/p", retry_s=0.01, drain_s=0.1)
    async with label.running():
        label.want(True)
        assert await _until(lambda: pod.writes == [True])
        label.want(False)  # the step-down while the write hangs: returns at once
        assert pod.writes == [True]
    # The end of `running` gave the removal its bounded time and went on.
    assert pod.labelled is False and pod.writes[-1] is False


async def test_drain_removes_the_label_for_good() -> None:
    pod = FakePod()
    label = leaderlabel.PodLabel(pod.write, "ns/p", retry_s=0.01)
    async with label.running():
        label.want(True)
        assert await _until(lambda: pod.labelled is True)
        await label.drain()
        assert pod.labelled is False
        label.want(True)  # still leading while the listeners drain: the label stays off
        await asyncio.sleep(0.05)
        assert pod.labelled is False and pod.writes.count(True) == 1


async def test_drain_retries_within_its_bound(caplog: pytest.LogCaptureFixture) -> None:
    pod = FakePod(labelled=True)
    label = leaderlabel.PodLabel(pod.write, "ns/p", retry_s=0.01, drain_s=0.5)
    pod.fail = 2
    await label.drain()
    assert pod.labelled is False and pod.writes == [False, False, False]
    pod.labelled, pod.fail = True, 1000
    other = leaderlabel.PodLabel(pod.write, "ns/p", retry_s=0.01, drain_s=0.1)
    with caplog.at_level(logging.WARNING, logger="gpuslice.extender.binding.leaderlabel"):
        await other.drain()
    assert pod.labelled is True
    assert any("could not remove gpuslice.io/leader from pod ns/p" in r.getMessage() for r in caplog.records)


# ----------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("environ", "argv", "expected"),
    [
        ({}, [], ("", "")),
        ({"POD_NAME": "gs-0", "POD_NAMESPACE": "gpu"}, [], ("gs-0", "gpu")),
        (
            {"POD_NAME": "gs-0", "POD_NAMESPACE": "gpu", "GPUSLICE_POD_NAME": "env"},
            ["--pod-namespace", "flag"],
            ("env", "flag"),
        ),
    ],
    ids=["unset", "downward-api-env", "gpuslice-env-and-flags-win"],
)
def test_pod_identity_settings(environ: dict[str, str], argv: list[str], expected: tuple[str, str]) -> None:
    settings = config.parse(argv, environ)
    assert (settings.pod_name, settings.pod_namespace) == expected


# ----------------------------------------------------------------------------- wiring in serve


@pytest.fixture
def kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    return str(path)


@pytest.mark.parametrize(
    ("mode", "pod", "follower", "label"),
    [
        ("lease", True, True, True),
        ("lease", False, True, False),
        ("scheduler", True, False, False),
        ("none", True, False, False),
    ],
    ids=["lease", "lease-without-pod", "scheduler", "none"],
)
def test_serve_wires_the_follower_and_the_label(
    kubeconfig: str, mode: str, pod: bool, follower: bool, label: bool
) -> None:
    values = {"kubeconfig": kubeconfig, "leader_elect": mode, "events": False}
    if pod:
        values |= {"pod_name": "gs-0", "pod_namespace": "gpu"}
    deps = serve.build(config.validate(values), logs.Log())
    # Before the first Lease attempt nobody leads: a lease follower is ready but flagged.
    assert deps.follower() is follower
    assert (deps.before_exit is not None) is label
    assert mode != "lease" or deps.follower_ready is label  # no label: a follower is not ready
    services = [getattr(s, "__self__", None) for s in deps.services]
    labels = [s for s in services if isinstance(s, leaderlabel.PodLabel)]
    assert len(labels) == int(label)
    if mode != "lease":
        return
    lead = next(s for s in services if isinstance(s, leader.OwnLease))
    assert labels == [] or services.index(labels[0]) < services.index(lead)  # left after the election
    lead._changed(True)
    assert deps.follower() is False and (labels == [] or labels[0]._wanted is True)
    lead._changed(False)
    assert deps.follower() is True and (labels == [] or labels[0]._wanted is False)
