"""List+watch informer: a correct cache feed for one kind.

The loop (kopf's ``watching.py`` shape, plus the relist diff client-go's reflector does)::

    list (paged: limit/continue) -> emit ADDED/MODIFIED per changed object -> emit DELETED for
    known objects the list no longer has -> emit LISTED -> watch from the list's resourceVersion
    with allowWatchBookmarks=true -> on a normal end (timeoutSeconds) watch again from the last
    resourceVersion seen (bookmarks advance it) -> on 410 Gone: list again, never re-watch at a
    stale resourceVersion -> every ``resync_s`` list again anyway (drift safety net).

Which list (the "Resource versions" section of the Kubernetes API concepts,
https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions): the first list,
and any list after the server refused one (410 on the list itself, an undecodable answer, a
"Too large resource version" answer), is a consistent one (no ``resourceVersion``: the most
recent state). Every later relist (the periodic resync, a 410 on the watch) asks for
``resourceVersionMatch=NotOlderThan`` with the newest resourceVersion the informer has seen: any
state at least that new, which the apiserver serves from its watch cache instead of etcd, and
which can never take the store back in time (such a list older than that is refused, to be safe
with servers that ignore ``resourceVersionMatch``, and the next list is a consistent one).
``resourceVersion=0`` ("any", possibly older than what was seen) is never sent: the watch cache
ignores ``limit`` for it and answers the whole collection in one response (150 000 pods: about
800 MB of JSON held at once; the process peaked at 1.8 GB in ``bench/bench_scale.py``). Since
Kubernetes 1.31 (``ConsistentListFromCache``) the consistent list is served from the watch cache
too, after one etcd read of the current revision, and since 1.34 (``ListFromCacheSnapshot``) its
later pages as well; older servers serve it from etcd. Pages are ``DEFAULT_PAGE_SIZE`` (5000)
objects, about 26 MB of pod JSON each: 150 000 pods in 30 requests where 500 a page took 300,
and the apiserver spent about 8 s of CPU on the list instead of about 15 s.

Each page is decoded into the kind's wire objects (``kinds.Kind``); an object whose
resourceVersion equals the stored one is skipped before it is built, so a resync relist builds and
emits only what changed. The garbage collector is paused while a page is decoded and applied (a
page allocates tens of thousands of containers at once, and every collection of a growing heap
rescans it: without the pause decoding takes twice as long).

Other failures (5xx, connection loss) mark the informer unhealthy and retry the watch at the
last resourceVersion after a capped exponential backoff; if that resourceVersion has been
compacted meanwhile the server answers 410 and the informer relists.

A frozen watch (a stuck apiserver or a half-open connection: no event, no bookmark and no end of
stream) is detected by the stream's read timeout, ``watch_timeout_s`` plus ``FROZEN_MARGIN_S``:
the server ends every watch after ``timeoutSeconds``, so silence past that means the stream is
dead; it counts as a failure and the watch is restarted. ``ready`` is False until the first list,
while a watch is failing, and from a 410 until the relist it forces has completed, so callers
never decide from a partial or unhealthy view. ``wait_for`` lets a caller wait until the informer
has applied every event up to a given resourceVersion (etcd revisions are one global counter, so
a node write's resourceVersion orders it against pod writes).

Handlers are plain synchronous callables (the cache is synchronous); an exception in a handler
is logged and does not stop the feed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import heapq
import itertools
import logging
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, NamedTuple, TypeVar

import msgspec

from gpuslice.kube import client as kclient
from gpuslice.kube import errors, kinds, objects

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PAGE_SIZE = 5000
NOT_OLDER_THAN = "NotOlderThan"
TOO_LARGE_RV = "Too large resource version"
"""The apiserver's message when its watch cache has not reached the resourceVersion asked for
(504, cause ``ResourceVersionTooLarge``): the list is retried as a consistent one."""
DEFAULT_WATCH_TIMEOUT_S = 300
DEFAULT_RESYNC_S = 1800.0
FROZEN_MARGIN_S = 5.0
"""Silence on a watch stream this long past its ``timeoutSeconds`` means the stream is dead."""
BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 30.0

_EVENT = msgspec.json.Decoder(objects.WatchEvent)
_STATUS = msgspec.json.Decoder(objects.Status)


class _MetaOnly(msgspec.Struct):
    metadata: objects.ObjectMeta = objects.ObjectMeta()


_META_ONLY = msgspec.json.Decoder(_MetaOnly)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No garbage collection inside (synchronous code only: nothing else runs meanwhile)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class EventType(enum.Enum):
    """What happened to an object (LISTED: a (re)list finished; the store is complete)."""

    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    LISTED = "LISTED"


class Event(NamedTuple, Generic[T]):
    """One change; ``obj`` is None only for LISTED (for DELETED it is the last known state)."""

    type: EventType
    obj: T | None


Handler = Callable[[Event[T]], None]


def retry_delay(failures: int, rng: Callable[[], float]) -> float:
    """Backoff after ``failures`` consecutive failures (>= 1): 0.2 s doubling, capped at 30 s, +-25 %."""
    base = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2.0 ** (failures - 1))
    return base * (0.75 + 0.5 * rng())


class Informer(Generic[T]):
    """Keeps ``store`` equal to the server's collection and tells ``handler`` every change.

    Args:
        kube: the API client.
        kind: what to watch (``kinds.NODES``, ``kinds.PODS``, ``kinds.QUOTAS`` or a variant).
        handler: called with every event, in order.
        page_size: list page size (``limit``; <= 0: one unpaged list).
        watch_cache: relist with ``resourceVersionMatch=NotOlderThan`` (from the apiserver's
            watch cache); False: every list is a consistent one.
        watch_timeout_s: ``timeoutSeconds`` of each watch request.
        resync_s: relist period (<= 0: never; 410 still relists).
        label_selector: optional ``labelSelector``.
        field_selector: optional ``fieldSelector``.
        clock: monotonic seconds (resync schedule).
        sleep: async sleep (retry backoff).
        rng: jitter source.
    """

    def __init__(
        self,
        kube: kclient.KubeClient,
        kind: kinds.Kind[T],
        handler: Handler[T],
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        watch_cache: bool = True,
        watch_timeout_s: int = DEFAULT_WATCH_TIMEOUT_S,
        resync_s: float = DEFAULT_RESYNC_S,
        label_selector: str | None = None,
        field_selector: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
    ):
        self.kube = kube
        self.kind = kind
        self.handler = handler
        self.page_size = page_size
        self.watch_cache = watch_cache
        self.watch_timeout_s = watch_timeout_s
        self.resync_s = resync_s
        self._selectors: dict[str, str] = {}
        if label_selector:
            self._selectors["labelSelector"] = label_selector
        if field_selector:
            self._selectors["fieldSelector"] = field_selector
        self._clock = clock
        self._sleep = sleep
        self._rng = rng
        self.store: dict[str, T] = {}
        self.resource_version = ""
        self.synced = False
        """True once the first list completed (stays True afterwards)."""
        self.healthy = False
        """True while the last list or watch request succeeded."""
        self.lists = 0
        self.gone = 0
        """How many times a 410 forced a relist."""
        self.restarts = 0
        """How many times a failure (not a normal watch end) restarted the loop."""
        self.relisting = False
        """True from a 410 (or an undecodable answer) until the relist it forces has completed.
        A periodic resync leaves the view complete while it runs and does not set it."""
        self.last_error: errors.ApiError | None = None
        self.seen_version = ""
        """The newest resourceVersion applied (kept when ``resource_version`` is cleared by a 410):
        a relist asks for a state at least this new."""
        self.consistent_next = True
        """The next list must be a consistent one (first list, or the server refused the last)."""
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @property
    def ready(self) -> bool:
        """Listed once, the last request succeeded, and no relist is half done."""
        return self.synced and self.healthy and not self.relisting

    def applied(self, resource_version: str) -> bool:
        """True when every event up to ``resource_version`` has been applied (False if unknown)."""
        mine, theirs = _revision(self.resource_version), _revision(resource_version)
        return mine is not None and theirs is not None and mine >= theirs

    async def wait_for(self, resource_version: str, timeout_s: float) -> bool:
        """Wait until ``applied(resource_version)``; False after ``timeout_s`` or if not comparable."""
        target = _revision(resource_version)
        if target is None or _revision(self.resource_version) is None:
            return False
        if self.applied(resource_version):
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (target, next(self._seq), future))
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            return self.applied(resource_version)
        finally:
            future.cancel()
        return True

    def _advance(self, resource_version: str) -> None:
        """Record the resourceVersion reached and wake the waiters it satisfies."""
        self.resource_version = resource_version
        if resource_version:
            self.seen_version = resource_version
        if not self._waiters:
            return
        reached = _revision(resource_version)
        if reached is None:
            return
        while self._waiters and self._waiters[0][0] <= reached:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)

    def _emit(self, event: Event[T]) -> None:
        try:
            self.handler(event)
        except Exception:
            log.exception("%s informer: handler failed on %s", self.kind.name, event.type.value)

    def list_params(self) -> dict[str, str | int | bool]:
        """The query of the first page of the next list (see the module docstring)."""
        params: dict[str, str | int | bool] = {}
        if self.page_size > 0:
            params["limit"] = self.page_size
        params.update(self._selectors)
        floor = self.seen_version
        if self.watch_cache and not self.consistent_next and _revision(floor) is not None:
            params["resourceVersion"] = floor
            params["resourceVersionMatch"] = NOT_OLDER_THAN
        return params

    async def relist(self) -> str:
        """List every object (paged), emit the differences to ``store`` and LISTED.

        Returns:
            The collection's resourceVersion (where the next watch starts).

        Raises:
            errors.ApiError: the list failed (``errors.Gone``: the next list is a consistent one).
        """
        seen: set[str] = set()
        cont = ""
        rv = ""
        while True:
            if cont:
                params: dict[str, str | int | bool] = {"continue": cont, **self._selectors}
                if self.page_size > 0:
                    params["limit"] = self.page_size
            else:
                params = self.list_params()
            try:
                resp = await self.kube.request("GET", self.kind.path, params=params)
            except errors.Gone:
                if not cont:
                    self.consistent_next = True
                    raise
                log.info("%s informer: list continue token expired; listing from the start", self.kind.name)
                seen.clear()
                cont = ""
                continue
            except errors.ApiError as exc:
                if cont or "resourceVersionMatch" not in params or TOO_LARGE_RV not in str(exc):
                    raise
                log.info("%s informer: %s; listing consistently", self.kind.name, exc)
                self.consistent_next = True
                continue
            with _gc_paused():
                page = self.kind.wire_list_decoder.decode(resp.content)
                del resp
                rv = page.metadata.resource_version
                if not cont and "resourceVersionMatch" in params:
                    self._check_not_older(rv)
                self._apply_page(page.items, seen)
                cont = page.metadata.continue_
                del page
            if not cont:
                break
        for key in [k for k in self.store if k not in seen]:
            self._emit(Event(EventType.DELETED, self.store.pop(key)))
        self.lists += 1
        self.synced = True
        self.healthy = True
        self.relisting = False
        self.consistent_next = False
        self._advance(rv)
        self._emit(Event(EventType.LISTED, None))
        return rv

    def _check_not_older(self, rv: str) -> None:
        """Refuse a watch-cache list older than what the informer has applied (back in time).

        A consistent list is the most recent state by definition and is never refused (etcd
        restored from a backup starts its revisions lower).
        """
        listed, floor = _revision(rv), _revision(self.seen_version)
        if listed is not None and floor is not None and listed < floor:
            self.consistent_next = True
            raise errors.ApiServerError(
                f"list {self.kind.path}: resourceVersion {rv} is older than {self.seen_version} already seen"
            )

    def _apply_page(self, items: list[Any], seen: set[str]) -> None:
        """Store and emit the listed objects that are new or changed (by resourceVersion)."""
        kind, store, meta = self.kind, self.store, self.kind.meta
        for wire in items:
            wmeta = wire.metadata
            key = sys.intern(objects.object_key(wmeta))
            seen.add(key)
            old = store.get(key)
            if old is not None and meta(old).resource_version == wmeta.resource_version:
                continue
            obj = kind.build_one(wire)
            store[key] = obj
            self._emit(Event(EventType.ADDED if old is None else EventType.MODIFIED, obj))

    def _apply(self, kind: str, raw: msgspec.Raw) -> None:
        """Apply one watch event to the store and emit it."""
        if kind == "BOOKMARK":
            self._advance(_META_ONLY.decode(raw).metadata.resource_version)
            return
        obj = self.kind.decoder.decode(raw)
        meta = self.kind.meta(obj)
        key = sys.intern(objects.object_key(meta))
        if kind == "DELETED":
            self.store.pop(key, None)
            self._emit(Event(EventType.DELETED, obj))
        elif kind in ("ADDED", "MODIFIED"):
            self.store[key] = obj
            self._emit(Event(EventType.MODIFIED if kind == "MODIFIED" else EventType.ADDED, obj))
        if meta.resource_version:
            self._advance(meta.resource_version)

    async def watch(self, timeout_s: int) -> None:
        """Watch from ``resource_version`` until the server ends the stream.

        Raises:
            errors.Gone: the resourceVersion is too old; the caller must relist.
            errors.ApiError: any other failure.
        """
        params: dict[str, str | int | bool] = {
            "watch": "true",
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_s,
            **self._selectors,
        }
        async with self.kube.stream(
            self.kind.path, params=params, read_timeout=timeout_s + FROZEN_MARGIN_S
        ) as resp:
            self.healthy = True
            async for line in resp.aiter_lines():
                if not line:
                    continue
                event = _EVENT.decode(line)
                if event.type == "ERROR":
                    status = _STATUS.decode(event.object)
                    raise errors.class_for(status.code or 500)(
                        f"watch {self.kind.path}: {status.message}", code=status.code, reason=status.reason
                    )
                self._apply(event.type, event.object)

    async def run(self, iterations: int | None = None) -> None:
        """Run the list/watch loop until cancelled (or for ``iterations`` watch requests, in tests)."""
        failures = 0
        next_resync = self._clock() + self.resync_s
        done = 0
        while iterations is None or done < iterations:
            try:
                # A relist that failed half way left the store partial: list again, never watch.
                resync_due = self.resync_s > 0 and self._clock() >= next_resync
                if not self.resource_version or self.relisting or resync_due:
                    await self.relist()
                    next_resync = self._clock() + self.resync_s
                timeout = self.watch_timeout_s
                if self.resync_s > 0:
                    timeout = max(1, min(timeout, int(next_resync - self._clock()) + 1))
                done += 1
                await self.watch(timeout)
                failures = 0
            except errors.Gone as exc:
                self.gone += 1
                self.last_error = exc
                log.info("%s informer: %s; relisting", self.kind.name, exc)
                self.resource_version = ""
                self.relisting = self.synced
            except errors.ApiError as exc:
                failures += 1
                self.restarts += 1
                self.healthy = False
                self.last_error = exc
                delay = retry_delay(failures, self._rng)
                log.warning("%s informer: %s; retrying in %.1fs", self.kind.name, exc, delay)
                await self._sleep(delay)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                failures += 1
                self.restarts += 1
                self.healthy = False
                self.last_error = errors.ApiServerError(f"{self.kind.path}: undecodable answer: {exc}")
                log.warning("%s informer: undecodable answer (%s); relisting", self.kind.name, exc)
                self.resource_version = ""
                self.relisting = self.synced
                self.consistent_next = True
                await self._sleep(retry_delay(failures, self._rng))


def _revision(resource_version: str) -> int | None:
    """A resourceVersion as the etcd revision it is, or None when it is not a number."""
    return int(resource_version) if resource_version.isdigit() else None
