"""The fake long-connection endpoint speaks Feishu's protocol: lark-oapi's own ``ws.Client``
(in a process of its own, ``tests/support/sdk_ws_client.py``) connects to it, pings it, takes
split events and card actions from it and ACKs them as the fake expects; the fake redelivers
what the SDK does not ACK with 200; and its refusals are the ones the SDK calls fatal."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import processes
from tests.support.fake_feishu_ws import FakeLongConnection, card_action, event
from tests.support.processes import ROOT, wait_for

# No test database here (a SQLite file of its own at most): the SQLite suite runs it once.
pytestmark = pytest.mark.any_database

FAST = {"ReconnectCount": -1, "ReconnectInterval": 1, "ReconnectNonce": 0, "PingInterval": 1}


@pytest.fixture
def fake() -> Iterator[FakeLongConnection]:
    with FakeLongConnection(
        {"cli_sdk": "sdk-secret"}, client_config=FAST, ack_timeout=0.5, redeliver_after=(0.2,) * 3
    ) as fake:
        yield fake


def sdk_client(
    fake: FakeLongConnection,
    out: Path,
    secret: str = "sdk-secret",  # noqa: S107 - the fake's
) -> subprocess.Popen[str]:
    """The SDK's client in a process of its own, its stderr in a file beside ``out``: a failing
    test shows it, and the process is killed after the test whatever happened."""
    log = out.with_name(f"sdk-{secret}.err")
    with open(log, "w") as err:  # the child keeps its own fd
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.sdk_ws_client",
                fake.url,
                "cli_sdk",
                secret,
                str(out),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
        )
    processes.started(f"lark-oapi ws client ({secret})", processes.log_file(log), proc)
    proc.stderr_path = log  # type: ignore[attr-defined]
    return proc


def exit_and_stderr(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """Its exit status and stderr, once it exits: importing lark_oapi alone is seconds of CPU
    (10,000 modules), minutes on a machine whose every core is busy; the bound is a guard."""
    code = proc.wait(240)
    return code, Path(proc.stderr_path).read_text()  # type: ignore[attr-defined]


def test_the_sdk_client_speaks_to_the_fake(fake: FakeLongConnection, tmp_path: Path) -> None:
    out = tmp_path / "events"
    proc = sdk_client(fake, out)
    try:
        # Guards, not goals (generous for a machine whose every core is busy): the SDK's
        # import alone is seconds of CPU (see exit_and_stderr).
        wait_for(lambda: fake.open_connections(), 240, "the SDK to connect")
        # pongs carry ClientConfig: the SDK takes PingInterval=1 s from them (its own is 120 s)
        wait_for(lambda: fake.conns[0].pings >= 3, 60, "three pings a second apart")

        fake.push("cli_sdk", event("split", app_id="cli_sdk"), fragments=4)
        fake.push("cli_sdk", card_action("card"))
        wait_for(lambda: fake.acked("split") and fake.acked("card"), 60, "the SDK's ACKs")
        assert out.read_text().split() == ["split"]
        (ack,) = fake.acks_of("card")
        assert ack.data == {"toast": {"type": "info", "content": "ok"}}
        assert ack.biz_rt is not None

        # a type the SDK has no handler for: it ACKs 500, and the fake delivers it again
        fake.push("cli_sdk", event("unhandled", event_type="contact.user.created_v3"))
        wait_for(lambda: len(fake.acks_of("unhandled")) >= 3, 60, "three deliveries")
        assert {a.code for a in fake.acks_of("unhandled")} == {500}

        # an abrupt disconnect: the SDK reconnects (ReconnectInterval 1 s, no nonce)
        fake.drop()
        wait_for(lambda: any(c.id >= 1 for c in fake.open_connections()), 60, "a reconnect")
        fake.push("cli_sdk", event("after", app_id="cli_sdk"))
        wait_for(lambda: fake.acked("after"), 60, "the event after the reconnect")
        assert out.read_text().split() == ["split", "after"]
    finally:
        proc.kill()
        proc.wait(10)


def test_the_fakes_refusals_are_fatal_to_the_sdk(fake: FakeLongConnection, tmp_path: Path) -> None:
    wrong = sdk_client(fake, tmp_path / "events", secret="wrong")
    code, err = exit_and_stderr(wrong)
    assert code != 0 and "invalid app_id or app_secret" in err

    fake.refuse_handshake("514", "exceed connection limit", "1000040350")
    limited = sdk_client(fake, tmp_path / "events")
    code, err = exit_and_stderr(limited)
    assert code != 0 and "exceed connection limit" in err
    assert fake.handshakes == 1 and not fake.open_connections()
