"""The gateway: the ``feishu_connect`` process. One channel (long connection) per app, their
reports, a probe.

- every app's ``Channel`` (its long connection) runs on one asyncio loop; stores run in a
  pool of threads (each with its own database connection), so a slow database never stalls
  pings or other ACKs;
- each connection's state is written to its row every ``REPORT_EVERY`` seconds (the admin
  dashboard shows it; a process that stops reporting is shown lost);
- ``--health-port``: ``GET /healthz`` answers 200 when every connection is open and answered
  its last ping in time, 503 otherwise, with each connection's state as JSON — a readiness
  probe for systemd, supervisor, Kubernetes; any answer at all says the process is alive;
- SIGTERM or SIGINT: no new frame is taken; the events in hand are stored and ACKed (at most
  their budget); the connections close; exit 0;
- a fatal refusal (bad credentials, too many connections): logged with the fix, the other
  connections are closed the same way, exit ``EXIT_REFUSED`` (78, EX_CONFIG: a supervisor
  should not restart it in a loop, README).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, close_old_connections, connections

from ..conf import InboxSettings
from ..extras import require
from ..ledger import reports as rows
from ..runtime.interrupts import dump_stacks_on_signal
from .channel import Channel, ChannelRefused, Status

log = logging.getLogger("feishu_inbox.connection")

EXIT_REFUSED = 78
STORE_THREADS = 4


class Gateway:
    def __init__(
        self,
        apps: list[str],
        conf: InboxSettings,
        *,
        health: tuple[str, int] | None = None,
    ) -> None:
        # Without websockets every connection would be "lost" and retried for ever.
        require("connect", "The long connection (manage.py feishu_connect)")
        self.conf = conf
        self.health = health
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.store_pool = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="feishu-store")
        self.report_pool = ThreadPoolExecutor(1, thread_name_prefix="feishu-report")
        self.channels = [
            Channel(app, conf.APPS[app], conf, store_pool=self.store_pool, on_change=self._changed)
            for app in apps
        ]
        self.changed = asyncio.Event()

    def run(self) -> int:
        """Serve until stopped (0) or refused (EXIT_REFUSED)."""
        code = 1
        try:
            code = asyncio.run(self._main())
            return code
        finally:
            self._shut_down(code)

    def _shut_down(self, code: int) -> None:
        """Let the stores in hand finish, for a while: one stuck on a lock or a lost database
        must not keep a stopping process alive (a supervisor's stop timeout would kill it)."""

        def wait_for_pools() -> None:
            self.store_pool.shutdown(wait=True)
            self.report_pool.shutdown(wait=True)

        done = threading.Thread(target=wait_for_pools, daemon=True)
        done.start()
        done.join(self.conf.ACK_BUDGET_SECONDS + 5)
        if done.is_alive():
            log.error("a store is stuck (database lock or outage); exiting without it")
            logging.shutdown()
            os._exit(code or 1)
        self._forget()

    def _changed(self, status: Status) -> None:
        self.changed.set()

    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        self.changed = asyncio.Event()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        dump_stacks_on_signal()  # kill -USR1: every thread's stack on stderr
        await loop.run_in_executor(self.report_pool, self._forget_lost)
        server = await self._serve_health() if self.health else None
        runs = {asyncio.ensure_future(c.run(stop)): c for c in self.channels}
        reporter = asyncio.ensure_future(self._report_until(stop))
        log.info(
            "feishu_connect: %d long connection(s) (%s), pid %d",
            len(self.channels),
            ", ".join(c.app for c in self.channels),
            self.pid,
        )
        code = 0
        pending = set(runs)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                exc = task.exception()
                if isinstance(exc, ChannelRefused):
                    log.error("%s %s. Fix: %s", exc.code, exc.message, exc.fix)
                    code = EXIT_REFUSED
                elif exc is not None:  # a defect: report it, stop the rest the same way
                    log.error("long connection of app %s failed", runs[task].app, exc_info=exc)
                    code = 1
                if exc is not None:
                    stop.set()
        stop.set()
        await reporter
        if server is not None:
            server.close()
            await server.wait_closed()
        log.info("feishu_connect stopped (exit %d)", code)
        return code

    # --- reports -------------------------------------------------------------------------------

    async def _report_until(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            self.changed.clear()  # before: a change during the write is reported next
            await loop.run_in_executor(self.report_pool, self._report)
            waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.changed.wait())}
            await asyncio.wait(
                waits, timeout=rows.REPORT_EVERY, return_when=asyncio.FIRST_COMPLETED
            )
            for w in waits:
                w.cancel()

    def _report(self) -> None:
        close_old_connections()
        try:
            rows.report(self.host, self.pid, [_as_report(c.status) for c in self.channels])
        except DatabaseError as exc:
            log.warning("could not report the connections' state: %s", type(exc).__name__)

    def _forget_lost(self) -> None:
        try:
            rows.forget_lost()
        except DatabaseError as exc:
            log.warning("could not remove lost connections' rows: %s", type(exc).__name__)
        finally:
            connections.close_all()

    def _forget(self) -> None:
        try:
            rows.forget(self.host, self.pid)
        except DatabaseError as exc:
            log.warning("could not remove this process's rows: %s", type(exc).__name__)
        finally:
            connections.close_all()

    # --- the probe -----------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, dict[str, object]]:
        now = time.time()
        window = self.conf.PING_SECONDS + self.conf.PONG_TIMEOUT_SECONDS + 1
        apps = {}
        ready = True
        for c in self.channels:
            s = c.status
            fresh = s.last_pong_at is not None and now - s.last_pong_at <= window
            ok = s.state == "connected" and fresh
            ready = ready and ok
            apps[c.app] = {
                "ready": ok,
                "state": s.state,
                "since": s.since,
                "last_pong_at": s.last_pong_at,
                "last_event_at": s.last_event_at,
                "events": s.events,
                "error": s.error,
            }
        return ready, {"ready": ready, "pid": self.pid, "connections": apps}

    async def _serve_health(self) -> asyncio.Server:
        assert self.health is not None
        host, port = self.health

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                line = await asyncio.wait_for(reader.readline(), 5)
                while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                    pass
                parts = line.split()
                if (
                    len(parts) >= 2
                    and parts[0] == b"GET"
                    and parts[1].split(b"?")[0] == b"/healthz"
                ):
                    ready, body = self.readiness()
                    status = "200 OK" if ready else "503 Service Unavailable"
                else:
                    status, body = (
                        "404 Not Found",
                        {"error": "not_found", "message": "GET /healthz"},
                    )
                data = json.dumps(body).encode()
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
            except (asyncio.TimeoutError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(answer, host, port)
        log.info("readiness probe on http://%s:%d/healthz", host, port)
        return server


def _as_report(status: Status) -> rows.Report:
    return rows.Report(
        app=status.app,
        state=status.state,
        since=status.since,
        connected_at=status.connected_at,
        last_event_at=status.last_event_at,
        last_pong_at=status.last_pong_at,
        events=status.events,
        error=status.error,
    )
