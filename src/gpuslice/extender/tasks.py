"""Background tasks that live exactly as long as an ``async with`` block."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
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
