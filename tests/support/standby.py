"""A throwaway PostgreSQL primary and a streaming standby made from it with ``pg_basebackup``
(the machine's server binaries, as ``private_postgres`` makes its cluster): the failover
tests kill the primary (SIGKILL, the whole process group) and promote the standby, as a
failover manager (Patroni, a cloud's) does, while the webhook and workers run.

``Replica.url()`` is the connection string a site uses: both hosts, ``target_session_attrs=
read-write`` and a short ``connect_timeout``, so every new connection finds whichever is the
primary now.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import psycopg

from tests.support.private_postgres import SERVER_USER, as_server_user, pg_ctl, server_bin
from tests.support.processes import free_port, started, tail, wait_for

DATABASE = "feishu_inbox"
STANDBY_NAME = "standby1"


def _run(*command: str) -> None:
    """A server binary (initdb, pg_basebackup), as the user who owns the clusters."""
    subprocess.run(
        as_server_user([str(server_bin() / command[0]), *command[1:]]),
        check=True,
        timeout=120,
        stdout=subprocess.DEVNULL,
    )


class Replica:
    """A primary and its standby, synchronous (``synchronous_standby_names`` names it,
    ``synchronous_commit = on``) or asynchronous."""

    def __init__(self, *, synchronous: bool) -> None:
        self.synchronous = synchronous
        self.home = Path(tempfile.mkdtemp(prefix="feishu_inbox-replica-"))
        if os.geteuid() == 0:
            shutil.chown(self.home, user=SERVER_USER)
        self.primary_data, self.standby_data = self.home / "primary", self.home / "standby"
        self.primary_port, self.standby_port = free_port(), free_port()
        self.promoted = False
        #: The WAL receiver ``hold_back_standby`` stopped.
        self._held: int | None = None

    def url(self, database: str = DATABASE) -> str:
        return (
            f"postgres://postgres@127.0.0.1:{self.primary_port},127.0.0.1:{self.standby_port}"
            f"/{database}?target_session_attrs=read-write&connect_timeout=2"
        )

    def direct(self, port: int, database: str = DATABASE) -> str:
        return f"postgres://postgres@127.0.0.1:{port}/{database}"

    def log(self, which: str) -> str:
        path = self.home / f"{which}.log"
        return tail(path.read_text(errors="replace")) if path.exists() else "(no log)"

    def start(self) -> Replica:
        _run(
            "initdb",
            "-D",
            str(self.primary_data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )
        self._configure(self.primary_data, self.primary_port, "primary")
        with open(self.primary_data / "postgresql.conf", "a") as conf:
            conf.write("wal_level = replica\nmax_wal_senders = 5\nwal_keep_size = '256MB'\n")
        pg_ctl(self.primary_data, "-l", str(self.home / "primary.log"), "start")
        started("primary", lambda: self.log("primary"))
        with psycopg.connect(self.direct(self.primary_port, "postgres"), autocommit=True) as db:
            db.execute(f"CREATE DATABASE {DATABASE}")
        _run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary_port),
            "-U",
            "postgres",
            "-D",
            str(self.standby_data),
            "-X",
            "stream",
            "-R",
            "--no-sync",
            "--checkpoint=fast",
        )
        self._configure(self.standby_data, self.standby_port, "standby")
        with open(self.standby_data / "postgresql.conf", "a") as conf:
            conf.write(f"cluster_name = '{STANDBY_NAME}'\nhot_standby = on\n")
            conf.write("synchronous_standby_names = ''\n")
        pg_ctl(self.standby_data, "-l", str(self.home / "standby.log"), "start")
        started("standby", lambda: self.log("standby"))
        if self.synchronous:  # now that it streams: before, every commit would wait for it
            with psycopg.connect(self.direct(self.primary_port, "postgres"), autocommit=True) as db:
                db.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
                db.execute("ALTER SYSTEM SET synchronous_commit = 'on'")
                db.execute("SELECT pg_reload_conf()")
        wait_for(self.streaming, 60, "the standby to stream from the primary")
        return self

    def _configure(self, data: Path, port: int, name: str) -> None:
        with open(data / "postgresql.conf", "a") as conf:
            conf.write(f"port = {port}\nlisten_addresses = '127.0.0.1'\n")
            conf.write(f"unix_socket_directories = '{self.home}'\nfsync = off\n")
            conf.write("max_connections = 200\n")

    def streaming(self) -> bool:
        """The standby streams (synchronously, when it should)."""
        want = "sync" if self.synchronous else "async"
        with psycopg.connect(self.direct(self.primary_port, "postgres"), autocommit=True) as db:
            row = db.execute(
                "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                (STANDBY_NAME,),
            ).fetchone()
        return row is not None and row == ("streaming", want)

    def kill_primary(self) -> None:
        """SIGKILL the primary's every process at once (its postmaster leads their group, in a
        session of its own): a host lost, no shutdown, no last WAL sent."""
        pid = int((self.primary_data / "postmaster.pid").read_text().split()[0])
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        wait_for(lambda: not _alive(pid), 30, "the primary to die")

    def hold_back_standby(self) -> int:
        """Stop the standby's WAL receiver (SIGSTOP): from now on what the primary commits is
        not streamed, as when an asynchronous standby lags; ``promote`` lets it go. Its pid."""
        with psycopg.connect(self.direct(self.standby_port, "postgres"), autocommit=True) as db:
            row = db.execute("SELECT pid FROM pg_stat_wal_receiver").fetchone()
        assert row is not None, "the standby has no WAL receiver"
        os.kill(row[0], signal.SIGSTOP)
        self._held = row[0]
        return row[0]

    def promote(self) -> None:
        held, self._held = self._held, None
        if held is not None:  # what it had not received is lost (not read from its socket)
            with contextlib.suppress(ProcessLookupError):
                os.kill(held, signal.SIGKILL)
        # A promotion ends recovery with the WAL it has; under make test-stress's CPU hog
        # one took over pg_ctl's default 60 s. What the tests prove is what survives it.
        pg_ctl(self.standby_data, "promote", wait=240)
        self.promoted = True

    def stop(self) -> None:
        for data in (self.standby_data, self.primary_data):
            pidfile = data / "postmaster.pid"
            if pidfile.exists() and _alive(int(pidfile.read_text().split()[0])):
                pg_ctl(data, "-m", "immediate", "stop", check=False)
        shutil.rmtree(self.home, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie until its parent (pg_ctl's, long gone: init) reaps it
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def wait_ready(url: str, timeout: float = 60) -> None:
    def answers() -> bool:
        try:
            psycopg.connect(url, connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    wait_for(answers, timeout, f"{url} to answer")
