"""The cluster view (``GET /ui``) in a real browser, against the e2e cluster.

Debian's ``chromium`` (``/usr/bin/chromium``) driven headless by Playwright through the system
browser: no browser is downloaded. Neither is optional: without them this module fails (an import
error or a failed fixture), it never skips, so the tier cannot pass quietly without the browser.

What the page lists per card (node, memory, cores, slots, pods) must equal what the audit of the
chaos tier rebuilds from the pods' HAMi annotations on the API (``tests/chaos/audit.py``), and a
pod bound while the page is open must appear on its card without a reload.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from playwright.sync_api import Page

from gpuslice.codec import keys, pod_devices
from gpuslice_dev import browser
from tests.chaos import audit
from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e

AGREE_S = 30.0
"""How long the page may take to show what the API shows (the cache follows the watch)."""

ERRORS: list[str] = []
"""Script errors, console errors (a blocked fetch included) and requests to anywhere but the extender."""

CardRow = tuple[str, int, int, int, tuple[str, ...]]
"""(node, MiB, cores, slots, pods) of one card."""

PAGE_CARDS = """() => Object.fromEntries(
  [...document.querySelectorAll('[data-testid=card]')].map((c) => [c.dataset.uuid, [
    c.dataset.node,
    Number(c.dataset.usedMemory) - Number(c.dataset.heldMemory),
    Number(c.dataset.usedCores) - Number(c.dataset.heldCores),
    Number(c.dataset.usedSlots) - Number(c.dataset.heldSlots),
    [...c.querySelectorAll('[data-pod]')].map((p) => p.dataset.pod).sort()]]))"""
"""Per card: node, usage by pods (capacity held for a preemptor is the cache's, not the API's), pods."""


@pytest.fixture(scope="module")
def page(e2e_cluster: Cluster) -> Iterator[Page]:
    chromium = browser.CHROMIUM
    assert chromium.is_file(), f"{chromium} is missing: apt-get install -y chromium (this tier needs it)"
    with browser.persistent_context() as context:
        tab = context.new_page()
        tab.on("pageerror", lambda err: ERRORS.append(f"script error: {err}"))
        tab.on("console", lambda msg: ERRORS.append(msg.text) if msg.type == "error" else None)
        tab.on(
            "request",
            lambda req: None if req.url.startswith(e2e_cluster.ext.url) else ERRORS.append(req.url),
        )
        tab.goto(e2e_cluster.ext.url + "/ui")
        yield tab


def page_cards(tab: Page) -> dict[str, CardRow]:
    got: dict[str, list[Any]] = tab.evaluate(PAGE_CARDS)
    return {u: (n, m, c, s, tuple(p)) for u, (n, m, c, s, p) in got.items()}


def api_cards(cluster: Cluster) -> dict[str, CardRow]:
    report = audit.api_usage(*audit.read(cluster.cp))
    return {u: (c.node, c.memory_mib, c.cores, c.slots, c.pods) for u, c in report.cards.items()}


def until(check: Callable[[], tuple[bool, str]], timeout: float = AGREE_S) -> None:
    """Poll ``check`` until it holds; fail with its last message after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        ok, message = check()
        if ok:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(message)
        time.sleep(0.3)


def diff(page: dict[str, CardRow], api: dict[str, CardRow]) -> str:
    uuids = sorted(set(page) | set(api))
    return "\n".join(
        f"{u}: page {page.get(u)} != API {api.get(u)}" for u in uuids if page.get(u) != api.get(u)
    )


def test_the_page_shows_the_cards_the_api_audit_shows(e2e_cluster: Cluster, page: Page) -> None:
    ns = e2e_cluster.namespace("ui")
    shapes = {
        "whole": {"nvidia.com/gpu": "1"},
        "half": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40000", "nvidia.com/gpucores": "50"},
        "small": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "20"},
    }
    for name, limits in shapes.items():
        e2e_cluster.create_pod(ns, name, limits)
    try:
        for name in shapes:
            e2e_cluster.wait_labelled(ns, name)
        audit.settle(e2e_cluster.cp)

        def agree() -> tuple[bool, str]:
            shown, api = page_cards(page), api_cards(e2e_cluster)
            return shown == api, "the page's cards differ from the API audit:\n" + diff(shown, api)

        until(agree)
        shown = page_cards(page)
        assert {p for *_, pods in shown.values() for p in pods} >= {f"{ns}/{n}" for n in shapes}
        nodes = page.eval_on_selector_all("[data-testid=node]", "els => els.map(e => e.dataset.node)")
        assert sorted(nodes) == sorted({row[0] for row in api_cards(e2e_cluster).values()})
        assert not ERRORS
    finally:
        for name in shapes:
            e2e_cluster.delete_pod(ns, name)


def test_a_pod_bound_while_the_page_is_open_appears_on_its_card_without_a_reload(
    e2e_cluster: Cluster, page: Page
) -> None:
    page.evaluate("() => { window.__sameDocument = true; }")
    polls_before = int(page.evaluate("() => Number(document.body.dataset.polls || 0)"))
    ns = e2e_cluster.namespace("ui")
    key = f"{ns}/late"
    e2e_cluster.create_pod(ns, "late", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "12000"})
    try:
        pod = e2e_cluster.wait_bound(ns, "late")
        containers = pod_devices.decode(pod["metadata"]["annotations"][keys.DEVICES_ALLOCATED])
        (grant,) = [g for c in containers for g in c]
        card = f"[data-testid=card][data-uuid='{grant.uuid}'] [data-pod='{key}']"

        def shown() -> tuple[bool, str]:
            where = f"{key} not shown on card {grant.uuid}:\n{page_cards(page)}"
            return page.locator(card).count() == 1, where

        until(shown)
        row = page_cards(page)[grant.uuid]
        assert row[0] == pod["spec"]["nodeName"]
        assert key in row[4] and row[1] >= 12000
        assert page.evaluate("() => window.__sameDocument === true"), "the page was reloaded"
        assert int(page.evaluate("() => Number(document.body.dataset.polls)")) > polls_before
        assert not ERRORS
    finally:
        e2e_cluster.delete_pod(ns, "late")

    def gone() -> tuple[bool, str]:
        return page.locator(card).count() == 0, f"{key} still shown after its deletion"

    until(gone)


PENDING_ROWS = """(key) => {
  const d = [...document.querySelectorAll('[data-testid=pending]')].find((e) => e.dataset.pod === key);
  if (!d) return null;
  const cards = (r) => [...r.querySelectorAll('[data-card]')].map((c) => [c.dataset.card, c.dataset.reason]);
  return Object.fromEntries(
    [...d.querySelectorAll('tr[data-node]')].map(
      (r) => [r.dataset.node, [r.dataset.fits === 'true', cards(r)]]));
}"""


def test_a_pending_pod_shows_the_same_per_card_explanation_as_explain(
    e2e_cluster: Cluster, page: Page
) -> None:
    ns = e2e_cluster.namespace("ui")
    key = f"{ns}/huge"
    e2e_cluster.create_pod(ns, "huge", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "200000"})
    try:
        e2e_cluster.wait_event(ns, "huge", "FilteringFailed")

        def same() -> tuple[bool, str]:
            shown = page.evaluate(PENDING_ROWS, key)
            with urllib.request.urlopen(f"{e2e_cluster.ext.url}/explain?pod={key}", timeout=10) as resp:
                doc = json.loads(resp.read())
            want = {
                n["name"]: [n["fits"], [[c["uuid"], c["reason"]] for c in n["cards"]]] for n in doc["nodes"]
            }
            return shown == want, f"page {shown}\n!= /explain {want}"

        until(same)
        shown = page.evaluate(PENDING_ROWS, key)
        assert shown and not any(fits for fits, _ in shown.values())
        assert {reason for _, cards in shown.values() for _, reason in cards} >= {"InsufficientGPUMemory"}
        assert not ERRORS
    finally:
        e2e_cluster.delete_pod(ns, "huge")

    def gone() -> tuple[bool, str]:
        return page.evaluate(PENDING_ROWS, key) is None, f"{key} still listed as pending after its deletion"

    until(gone)
