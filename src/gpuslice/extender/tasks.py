"""Small async helpers: background tasks that live as long as an ``async with`` block, bounded waits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any


@contextlib.asynccontextmanager
async def background(coro: Coroutine[Any, Any, None], name: str) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``coro`` as a task for the duration of the block; cancel and await it on exit."""
    task = asyncio.create_task(coro, name=name)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def wait_until(
    condition: Callable[[], bool], timeout_s: float, clock: Callable[[], float], period_s: float = 0.05
) -> bool:
    """Poll ``condition`` every ``period_s`` for at most ``timeout_s``; whether it came true."""
    deadline = clock() + timeout_s
    while not condition():
        if clock() >= deadline:
            return False
        await asyncio.sleep(period_s)
    return True
