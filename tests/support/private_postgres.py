"""A PostgreSQL cluster of one's own for a command: the tests that stop the whole cluster.

    python -m tests.support.private_postgres COMMAND [ARG ...]

Creates a throwaway cluster with the machine's PostgreSQL server binaries (``initdb`` in a
temporary directory, listening on 127.0.0.1 on a free port), runs COMMAND with
``DATABASE_URL`` naming it and ``FEISHU_INBOX_TEST_PGDATA`` its data directory (what
``tests.support.outages.postgresql_stopped`` stops and starts), then stops and removes it; exits
with COMMAND's status. So ``make test`` runs the tests that stop PostgreSQL beside the rest of
the PostgreSQL suite instead of before it: they stop only their own cluster. As root, the
cluster's commands run as the ``postgres`` user (``initdb`` refuses root).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.processes import free_port

SERVER_USER = "postgres"


def server_bin() -> Path:
    """The newest installed server's bindir (Debian: /usr/lib/postgresql/N/bin), else PATH's."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise SystemExit(
            "private_postgres: no PostgreSQL server binaries (initdb, pg_ctl) here. "
            "Debian/Ubuntu: apt-get install postgresql"
        )
    return Path(initdb).parent


def as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--", *command] if os.geteuid() == 0 else command


def pg_ctl(data: Path, *args: str, check: bool = True, wait: int = 60) -> None:
    """``pg_ctl -D data ARGS``, as the user who owns the cluster; waits (``-w``) up to
    ``wait`` seconds."""
    command = as_server_user(
        [str(server_bin() / "pg_ctl"), "-D", str(data), "-w", "-t", str(wait), *args]
    )
    subprocess.run(command, check=check, timeout=wait + 10, stdout=subprocess.DEVNULL)


def main(command: list[str]) -> int:
    if not command:
        raise SystemExit(__doc__)
    # make killed, a CI run cancelled, a terminal closed: stop the cluster (pg_ctl put it in a
    # session of its own, out of reach of its process group's signals) and remove it.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    home = Path(tempfile.mkdtemp(prefix="feishu_inbox-pg-"))
    try:
        if os.geteuid() == 0:
            shutil.chown(home, user=SERVER_USER)
        data, port = home / "data", free_port()
        initdb = [str(server_bin() / "initdb"), "-D", str(data), "-U", "postgres"]
        subprocess.run(
            as_server_user([*initdb, "--auth=trust", "--no-sync", "-E", "UTF8"]),
            check=True,
            timeout=120,
            stdout=subprocess.DEVNULL,
        )
        with open(data / "postgresql.conf", "a") as conf:
            conf.write(f"port = {port}\nlisten_addresses = '127.0.0.1'\n")
            conf.write(f"unix_socket_directories = '{home}'\n")
        try:
            pg_ctl(data, "-l", str(home / "server.log"), "start")
            env = {
                **os.environ,
                "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/feishu_inbox",
                "FEISHU_INBOX_TEST_PGDATA": str(data),
            }
            return subprocess.run(command, env=env, check=False).returncode
        finally:  # whatever state a test left it in: stopped already, or still starting
            pg_ctl(data, "-m", "immediate", "stop", check=False)
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
