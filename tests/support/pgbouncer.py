"""PgBouncer (the distribution's package) in front of a PostgreSQL server, for a test or a
whole suite: ``PgBouncer(...).start()`` on a free port, in transaction mode with a pool
smaller than the workers' connections, every database name passed through to the server.

``FEISHU_INBOX_TEST_TOPOLOGY`` runs a suite's subprocesses (workers, gunicorn, commands)
through one (``subprocess_topology``): ``pgbouncer`` with LISTEN on a direct connection
(``LISTEN_URL``), ``pgbouncer-poll`` without any LISTEN (``POLL_ONLY``); the test process
itself stays on its direct connection. ``make test-postgres-topologies`` runs the worker,
steps, schedules, replies and streams tests that way.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.support.private_postgres import SERVER_USER
from tests.support.processes import free_port, port_open, started, tail, wait_for

#: Where Debian's package puts it.
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
#: Server connections per database and user: fewer than two workers' connections (each
#: worker holds one per slot's claim, its heartbeat, its chores), as the issue asks.
POOL_SIZE = 3
TOPOLOGIES = ("direct", "pgbouncer", "pgbouncer-poll")


class PgBouncer:
    """One pgbouncer process (foreground, its log in its directory); as root it runs as the
    ``postgres`` user (it refuses root)."""

    def __init__(
        self,
        server_host: str,
        server_port: int,
        *,
        pool_size: int = POOL_SIZE,
        mode: str = "transaction",
    ) -> None:
        self.server = (server_host, server_port)
        self.pool_size = pool_size
        self.mode = mode
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="feishu_inbox-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.dir / "pgbouncer.log"

    def url(self, database: str, user: str = "postgres") -> str:
        return f"postgres://{user}@127.0.0.1:{self.port}/{database}"

    def start(self, *, per_test: bool = True) -> PgBouncer:
        """Start it; ``per_test``: the test's (its log shown when it fails, killed after it),
        else the suite's (stopped when the pytest process exits)."""
        if not Path(PGBOUNCER).exists():
            raise AssertionError(
                "no pgbouncer here: apt-get install pgbouncer (make setup installs it as root)"
            )
        host, port = self.server
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            f"""[databases]
* = host={host} port={port} user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = any
pool_mode = {self.mode}
default_pool_size = {self.pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 1000
max_db_connections = {self.pool_size}
server_reset_query =
server_check_delay = 1
server_login_retry = 1
ignore_startup_parameters = extra_float_digits,options
admin_users = postgres
logfile = {self.log}
"""
        )
        command = [PGBOUNCER, str(ini)]
        if os.geteuid() == 0:
            shutil.chown(self.dir, user=SERVER_USER)
            shutil.chown(ini, user=SERVER_USER)
            command = [PGBOUNCER, "-u", SERVER_USER, str(ini)]
        with open(self.dir / "stderr", "wb") as stderr:  # the child keeps its own copy
            self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        if per_test:
            started(f"pgbouncer :{self.port}", self.read_log, self.proc)
        wait_for(
            lambda: port_open(self.port) or self.proc is None or self.proc.poll() is not None,
            30,
            "pgbouncer to listen",
        )
        if self.proc.poll() is not None:
            raise AssertionError(f"pgbouncer exited at start:\n{self.read_log()}")
        return self

    def show(self, what: str) -> list[dict[str, object]]:
        """Its admin console's ``SHOW <what>`` (CLIENTS, SERVERS, POOLS), as dicts."""
        import psycopg
        from psycopg.rows import dict_row

        console = psycopg.connect(self.url("pgbouncer"), autocommit=True, row_factory=dict_row)
        with console:
            # the console takes the simple query protocol only
            return list(console.execute(f"SHOW {what}", prepare=False).fetchall())

    def read_log(self) -> str:
        text = ""
        for name in ("stderr", "pgbouncer.log"):
            path = self.dir / name
            if path.exists():
                text += path.read_text(errors="replace")
        return tail(text)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def topology() -> str:
    """The suite's topology (``FEISHU_INBOX_TEST_TOPOLOGY``; direct by default)."""
    found = os.environ.get("FEISHU_INBOX_TEST_TOPOLOGY", "") or "direct"
    if found not in TOPOLOGIES:
        raise AssertionError(f"FEISHU_INBOX_TEST_TOPOLOGY={found!r}: one of {TOPOLOGIES}")
    return found


_suite_bouncer: list[PgBouncer] = []


def topology_env(direct_url: str, name: str) -> dict[str, str]:
    """What a subprocess's environment changes to reach ``direct_url``'s database in the
    topology ``name``: through PgBouncer (started once per pytest process), with its
    wake-ups on a direct LISTEN connection or none."""
    if name == "direct" or not direct_url.startswith("postgres"):
        return {}
    parts = urlsplit(direct_url)
    if not _suite_bouncer:
        bouncer = PgBouncer(parts.hostname or "127.0.0.1", parts.port or 5432)
        bouncer.start(per_test=False)
        _suite_bouncer.append(bouncer)
        atexit.register(bouncer.stop)
    return pooled_env(direct_url, _suite_bouncer[0], listen=name == "pgbouncer")


def pooled_env(direct_url: str, bouncer: PgBouncer, *, listen: bool) -> dict[str, str]:
    """A subprocess's environment changes to reach ``direct_url``'s database through
    ``bouncer``: wake-ups on ``direct_url`` itself (LISTEN_URL), or none (POLL_ONLY)."""
    parts = urlsplit(direct_url)
    pooled = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{bouncer.port}"))
    env = {"DATABASE_URL": pooled, "FEISHU_INBOX_TRANSACTION_POOLER": "1"}
    if listen:
        env["FEISHU_INBOX_LISTEN_URL"] = direct_url
    else:
        env["FEISHU_INBOX_POLL_ONLY"] = "1"
    return env
