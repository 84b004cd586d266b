"""``manage.py inbox``: the operator CLI over the ledger functions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from feishu_inbox import ledger
from feishu_inbox.models import EventJob
from tests.support.factories import EventJobFactory
from tests.support.ledger_helpers import snapshot

ROOT = Path(__file__).resolve().parents[2]


def inbox(*args: str) -> str:
    out = StringIO()
    call_command("inbox", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_stats_json_on_a_fresh_sqlite_database_after_migrate(tmp_path: Path) -> None:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'fresh.sqlite3'}"}
    # --settings after the subcommand, as after any other command (issue 55).
    for args in (
        ["migrate", "--no-input", "-v", "0"],
        ["inbox", "stats", "--json", "--settings", "project.settings"],
    ):
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["counts"] == {
        "queued": 0,
        "running": 0,
        "retry_wait": 0,
        "completed": 0,
        "failed": 0,
        "unknown": 0,
        "waiting": 0,
    }
    assert stats["blocked_partitions"] == 0 and stats["oldest_due_age_seconds"] is None


@pytest.mark.parametrize("limit", ["-5", "0", "many"])
def test_list_limit_must_be_a_positive_whole_number(limit: str) -> None:
    # Refused by the parser: printed nothing and exited 0 before (issue 55).
    done = subprocess.run(
        [sys.executable, "manage.py", "inbox", "list", "--limit", limit],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "not a positive whole number" in done.stderr, done.stderr


@pytest.mark.django_db
def test_stats_says_which_due_jobs_wait_behind_an_unresolved_head() -> None:
    head = EventJobFactory(partition_key="chat")
    EventJobFactory(partition_key="chat")
    EventJobFactory(partition_key="chat")
    (claimed,) = ledger.claim("w1")
    assert claimed.lease.job_id == head.pk  # the head runs; the two behind it are due
    lines = inbox("stats").splitlines()
    assert (
        "due 2 (0 claimable now, 2 behind an unresolved earlier job of their chat), delayed 0"
        in lines
    )
    assert "oldest claimable due: -" in lines
    stats = json.loads(inbox("stats", "--json"))
    assert (stats["due"], stats["due_behind_head"], stats["oldest_due_age_seconds"]) == (2, 2, None)


@pytest.mark.django_db
def test_list_and_show() -> None:
    job = EventJobFactory(payload={"text": "你好"})
    EventJobFactory(partition_key="other")
    rows = json.loads(inbox("list", "--partition", "chat-1", "--json"))
    assert [r["id"] for r in rows] == [job.pk]
    assert json.loads(inbox("list", "--status", "queued", "--json"))[0]["status"] == "queued"
    shown = json.loads(inbox("show", str(job.pk), "--json"))
    assert shown["payload"] == {"text": "你好"} and shown["attempts"] == []
    assert "chat-1" in inbox("list")
    with pytest.raises(CommandError, match="no job 424242"):
        inbox("show", "424242")


@pytest.mark.django_db
def test_requeue_refusal_names_each_job_exits_non_zero_and_moves_nothing() -> None:
    queued = EventJobFactory(partition_key="a")
    failed = EventJobFactory(partition_key="b")
    with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 1}):
        for claimed in ledger.claim("w", limit=2):
            if claimed.id == failed.pk:
                ledger.fail(claimed.lease, error_type="Boom")
            else:
                ledger.hand_back(claimed.lease)
    before = snapshot(queued.pk)
    err = StringIO()
    with pytest.raises(CommandError, match="1 of 2 jobs refused"):
        call_command(
            "inbox", "requeue", str(queued.pk), str(failed.pk), stdout=StringIO(), stderr=err
        )
    assert f"job {queued.pk}: refused: [invalid_state] Cannot requeue job {queued.pk}: it is" in (
        err.getvalue()
    )
    assert snapshot(queued.pk) == before
    assert EventJob.objects.get(pk=failed.pk).status == "queued"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "given", ["9223372036854775808", "9" * 30, "0" * 30 + "9" * 5000, "0", "-1", "1e3", "١٢"]
)
def test_an_id_no_job_can_have_is_refused_with_what_an_id_is(given: str) -> None:
    """Past a signed 64-bit id, SQLite's driver raised OverflowError (a traceback), and
    Python refuses int() of thousands of digits: the fuzzer found the first."""
    job = EventJobFactory(partition_key="a")
    before = snapshot(job.pk)
    for action in ("requeue", "discard", "cancel", "replay"):
        with pytest.raises(CommandError, match=f"{given[:10]}.* is not a job id: a whole number"):
            inbox(action, str(job.pk), given)
    with pytest.raises(CommandError, match="There is no job"):
        inbox("show", given)
    assert snapshot(job.pk) == before
    with pytest.raises(CommandError, match="1 of 1 jobs refused"):  # the largest id: no job
        inbox("requeue", "09223372036854775807")


@pytest.mark.django_db
def test_reconcile_discard_and_purge() -> None:
    unknown = EventJobFactory(partition_key="u")
    lease = ledger.claim("w")[0].lease
    ledger.begin_effect(lease)
    ledger.finish(lease)
    assert "marked done" in inbox("reconcile", str(unknown.pk), "--applied")
    assert EventJob.objects.get(pk=unknown.pk).status == "completed"
    with pytest.raises(CommandError, match="refused"):
        inbox("discard", str(unknown.pk))
    assert "deleted 0 completed jobs" in inbox("purge")
    with pytest.raises(CommandError):
        call_command("inbox", "reconcile", str(unknown.pk), stdout=StringIO(), stderr=StringIO())


@pytest.mark.django_db
def test_cli_actions_are_recorded_under_the_given_user() -> None:
    from django.contrib.admin.models import LogEntry
    from django.contrib.auth.models import User

    operator = User.objects.create_user("oncall")
    job = EventJobFactory()
    lease = ledger.claim("w")[0].lease
    ledger.begin_effect(lease)
    ledger.finish(lease)
    with pytest.raises(CommandError, match="no user 'ghost'"):
        inbox("reconcile", str(job.pk), "--applied", "--user", "ghost")
    assert EventJob.objects.get(pk=job.pk).status == "unknown"  # nothing moved
    inbox("reconcile", str(job.pk), "--applied", "--user", "oncall")
    entry = LogEntry.objects.get(object_id=str(job.pk))
    assert entry.user == operator
    assert "the effect happened" in entry.get_change_message()


@pytest.mark.django_db
def test_cancel_and_replay_from_the_shell_with_codes_in_json() -> None:
    finished = EventJobFactory(partition_key="a")
    ledger.finish(ledger.claim("w")[0].lease, note="NoHandler")
    running = EventJobFactory(partition_key="c")
    assert [j.id for j in ledger.claim("w")] == [running.pk]
    waiting = EventJobFactory(partition_key="b")
    out = StringIO()
    with pytest.raises(CommandError, match="1 of 3 jobs refused"):
        call_command(
            "inbox", "cancel", str(waiting.pk), str(running.pk), str(finished.pk), "--json",
            stdout=out, stderr=StringIO(),
        )  # fmt: skip
    result = json.loads(out.getvalue())
    assert result["done"] == [waiting.pk] and result["pending"] == [running.pk]
    [refused] = result["refused"]
    assert (refused["id"], refused["code"]) == (finished.pk, "invalid_state")
    assert refused["message"].startswith(f"Cannot cancel job {finished.pk}: it is completed")
    assert refused["fix"]
    assert EventJob.objects.get(pk=waiting.pk).error_type == "Cancelled"
    assert f"job {finished.pk}: replayed" in inbox(
        "replay", "--error", "NoHandler", "--since", "1h"
    )
    assert EventJob.objects.get(pk=finished.pk).status == "queued"


@pytest.mark.django_db
def test_replay_without_ids_or_filters_is_refused_with_its_code() -> None:
    with pytest.raises(CommandError, match=r"^\[invalid_argument\] replay needs job ids"):
        inbox("replay")
    with pytest.raises(CommandError, match="neither an ISO 8601 time nor a duration"):
        inbox("replay", "--since", "yesterday-ish")
    with pytest.raises(CommandError, match=r"^\[not_found\] There is no job 4242"):
        inbox("show", "4242")


@pytest.mark.django_db
@pytest.mark.usefixtures("registry")
def test_schedules_list_pause_resume_run_now_with_the_user_recorded() -> None:
    from django.contrib.admin.models import LogEntry
    from django.contrib.auth.models import User

    from tests.support.schedule_helpers import declare

    User.objects.create_user("oncall")
    declare("digest", "0 9 * * 1-5", tz="Asia/Shanghai")
    (listed,) = json.loads(inbox("schedules", "--json"))
    assert (listed["name"], listed["description"], listed["paused"]) == (
        "digest",
        "At 09:00 on Monday through Friday",
        False,
    )
    assert listed["next_occurrence_local"].endswith("T09:00:00+08:00")
    assert "digest" in inbox("schedules") and "no job yet" in inbox("schedules")

    assert "schedule digest: pause schedule" in inbox("schedules", "pause", "digest")
    err = StringIO()
    with pytest.raises(CommandError, match="2 of 2 schedules refused"):
        call_command(
            "inbox", "schedules", "pause", "digest", "ghost", stdout=StringIO(), stderr=err
        )
    # In the [code] message — fix form of every other refusal (issue 55).
    refused = err.getvalue()
    paused = "[invalid_state] Cannot pause schedule 'digest': it is already paused"
    assert f"schedule digest: refused: {paused}" in refused, refused
    assert "schedule ghost: refused: [" in err.getvalue()
    assert err.getvalue().count(" — ") >= 2, err.getvalue()
    inbox("schedules", "resume", "digest", "--user", "oncall")
    out = inbox("schedules", "run-now", "digest", "--user", "oncall")
    job = EventJob.objects.get(event_type="schedule.digest")
    assert f"schedule digest: run now: job {job.pk}" in out
    assert job.payload["requested_by"] == "oncall"
    assert [e.get_change_message() for e in LogEntry.objects.order_by("id")] == [
        "Resume schedule (manage.py inbox)",
        "Run now (manage.py inbox)",
    ]
    assert json.loads(inbox("schedules", "--json"))[0]["last_job_status"] == "queued"


@pytest.mark.django_db(transaction=True)
def test_runworker_in_process_leaves_the_signal_handlers_as_it_found_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """runworker installs its SIGTERM/SIGINT handlers on the main thread; a run inside a
    site's own process (or a test's) gives the old ones back however it ends, a failed
    start included. Else Ctrl-C in that process would only ask a finished worker to stop."""
    import signal

    from feishu_inbox.feishu import openapi

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    call_command("runworker", "--burst", "-v", "0")
    assert {sig: signal.getsignal(sig) for sig in before} == before

    def broken_warm_up() -> bool:
        raise RuntimeError("the Feishu SDK failed to load")

    monkeypatch.setattr(openapi, "warm_up", broken_warm_up)
    with pytest.raises(RuntimeError, match="failed to load"):
        call_command("runworker", "--burst", "-v", "0")
    assert {sig: signal.getsignal(sig) for sig in before} == before


@pytest.mark.django_db
def test_demo_data_says_what_it_added_apart_from_what_the_ledger_holds() -> None:
    first = inbox("demo-data")
    added = EventJob.objects.count()
    assert first.startswith(f"added {added} example jobs; the ledger now holds: "), first
    second = inbox("demo-data")  # totals now twice what was added: not labelled "added"
    assert second.startswith(f"added {EventJob.objects.count() - added} example jobs;"), second


def test_list_kind_help_names_exactly_its_choices() -> None:
    # The help once said "events, schedules or tasks" while the choices were singular (issue 55).
    from feishu_inbox.ledger.kinds import choices
    from feishu_inbox.management.commands.inbox import Command

    parser = Command().create_parser("manage.py", "inbox")
    sub = next(a for a in parser._actions if a.dest == "action")
    kind = next(a for a in sub.choices["list"]._actions if a.dest == "kind")  # type: ignore[attr-defined]
    assert sorted(kind.choices) == sorted(choices())
    for name in kind.choices:
        assert f"{name} (" in kind.help, kind.help
