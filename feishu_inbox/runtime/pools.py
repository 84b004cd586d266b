"""Where jobs run: the handler threads (``HandlerPool``), the event loop of ``async def``
handlers (``AsyncRunner``), and which jobs hold the worker's slots (``Slots``)."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connections

from . import context, handlers

log = logging.getLogger("feishu_inbox.worker")


class HandlerPool:
    """Daemon threads that keep their database connection between jobs.

    A job whose lease was lost keeps its thread until its handler returns, but gives up its
    slot at once; the pool grows a thread for the next job rather than wait for it.
    """

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()
        self._count = 0
        self._threads: list[threading.Thread] = []

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            if self._idle == 0:
                self._count += 1
                thread = threading.Thread(
                    target=self._run, name=f"feishu-handler-{self._count}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1
        self._tasks.put(task)

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:  # shut down: this thread's connections go with it
                connections.close_all()
                return
            try:
                task()
            except BaseException:  # the thread must live on for the next job
                log.exception("unexpected error in a handler thread")
            with self._lock:
                self._idle += 1

    def shutdown(self, timeout: float) -> list[threading.Thread]:
        """End the threads (each closes its database connections) and wait for them up to
        ``timeout`` seconds; a thread still running a handler (one abandoned at its timeout)
        is left to finish it, and ends then. Returns the threads still alive.

        Every thread is told, not only the idle ones: a slot's thread frees its slot before
        it has returned to the pool (it counts and logs the job's end), so the worker may be
        closing while it is not idle yet; told only the idle ones, it would wait for a next
        task for ever (a thread left behind in a process that ran ``runworker --burst``)."""
        with self._lock:
            self._idle = 0
            threads = list(self._threads)
        for _ in threads:
            self._tasks.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t for t in self._threads if t.is_alive()]


class AsyncRunner:
    """One event loop thread for ``async def`` handlers, started on first use."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, coro_fn: Callable[[], Any], ctx: context.JobContext | None = None) -> Any:
        """Run the coroutine on the loop and wait for it; ``ctx`` (a job's) gets the means to
        cancel it (its timeout)."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._loop.set_default_executor(  # asyncio.to_thread: the handlers' writes
                    ThreadPoolExecutor(
                        thread_name_prefix="feishu-async-db",
                        initializer=handlers.keep_connections,
                    )
                )
                self._thread = threading.Thread(
                    target=self._loop.run_forever, name="feishu-async", daemon=True
                )
                self._thread.start()
            loop = self._loop
        future = asyncio.run_coroutine_threadsafe(coro_fn(), loop)
        if ctx is not None:
            ctx.cancel_async = future.cancel
        return future.result()

    def close(self, timeout: float) -> None:
        """Stop the loop, its thread and its executor's threads (``asyncio.to_thread``)."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return

        async def stop() -> None:
            await loop.shutdown_default_executor()
            loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), loop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()
            handlers.close_executor_connections()  # its executor's threads have ended


class Slots:
    """Which jobs hold this worker's slots, and how many jobs it has claimed.

    A slot is taken in ``take`` (a claim) and freed in ``free`` only: when its job ends (the
    slot passing to the job its finish claimed, if any), or at once when the job's lease is
    lost. A job claimed by a finish always runs, even if the finished one lost its slot
    meanwhile.
    """

    def __init__(self, wake: threading.Event) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._held: dict[int, context.JobContext] = {}
        #: Jobs claimed so far (``--max-jobs``), reservations for finishes included.
        self.claimed = 0

    def take(self, ctx: context.JobContext) -> None:
        with self._lock:
            self._held[ctx.event.job_id] = ctx

    def count(self, claimed: int) -> None:
        """Jobs claimed (by the main thread's claims and batches) or handed back (< 0)."""
        with self._lock:
            self.claimed += claimed

    def free(self, ctx: context.JobContext, successor: context.JobContext | None = None) -> None:
        with self._lock:
            if self._held.get(ctx.event.job_id) is ctx:
                del self._held[ctx.event.job_id]
            if successor is not None:
                self._held[successor.event.job_id] = successor
                return  # the slot passed on: nothing for the claimer to do
        self._wake.set()

    def reserve(self, max_jobs: int | None) -> int:
        """One more claim, for a finish that claims its slot's next job; 0 at --max-jobs."""
        with self._lock:
            if max_jobs is not None and self.claimed >= max_jobs:
                return 0
            self.claimed += 1
            return 1

    def unreserve(self, count: int) -> None:
        with self._lock:
            self.claimed -= count

    def held(self) -> list[context.JobContext]:
        with self._lock:
            return list(self._held.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)
