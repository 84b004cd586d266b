"""Fuzzers of the operators' inputs: ``manage.py inbox`` arguments and admin action posts.

Whatever an operator types or a form posts, the answer is an outcome or a clear refusal (a
``CommandError``, a message on the page), never a traceback or a 500; and what a refusal
refuses moves no row.
"""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feishu_inbox.management.demo_data import fill
from feishu_inbox.models import Attempt, EventJob, Partition, Schedule, Step
from tests.admin.test_admin import ACTION_NAMES, CHANGELIST

pytestmark = pytest.mark.django_db

FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)

#: What a shell can hand a command: any text, lone surrogates included (Python decodes bytes
#: that are no UTF-8 in argv to them).
any_text = st.text(st.characters(exclude_categories=()), max_size=10)
#: What a form can post: text (a body's bytes that are no UTF-8 arrive as U+FFFD).
form_text = st.text(max_size=10)
#: A word an operator might type: a subcommand, a flag, a number, a time, or anything.
VOCABULARY = [
    "stats",
    "list",
    "show",
    "requeue",
    "reconcile",
    "discard",
    "cancel",
    "replay",
    "purge",
    "schedules",
    "pause",
    "resume",
    "run",
    "--json",
    "--status",
    "--partition",
    "--kind",
    "--queue",
    "--limit",
    "--user",
    "--applied",
    "--not-applied",
    "--from-step",
    "--event-type",
    "--app",
    "--since",
    "--error",
    "queued",
    "failed",
    "unknown",
    "task",
    "event",
    "30m",
    "-1",
    "0",
    "2026-13-45",
    "999999999999999999999999999999",
]
words = st.one_of(
    st.sampled_from(VOCABULARY),
    st.integers(min_value=-5, max_value=10**20).map(str),
    any_text,
)


@pytest.fixture
def ledger_data() -> None:
    fill()


def snapshot() -> list[list[tuple[Any, ...]]]:
    """Every row of the ledger's tables, exactly as stored."""
    return [
        list(model.objects.order_by("pk").values_list())
        for model in (EventJob, Partition, Attempt, Step, Schedule)
    ]


@pytest.mark.usefixtures("ledger_data")
@FUZZ
@given(args=st.lists(words, min_size=1, max_size=6))
def test_inbox_arguments_end_in_an_outcome_or_a_command_error(args: list[str]) -> None:
    with transaction.atomic():
        before = snapshot()
        out, err = StringIO(), StringIO()
        try:
            call_command("inbox", *args, stdout=out, stderr=err)
        except CommandError as refused:
            assert str(refused).strip(), args  # says what was wrong
            assert snapshot() == before, f"refused {args} but moved rows: {refused}"
        transaction.set_rollback(True)


def operator() -> Client:
    user = User.objects.filter(username="fuzz").first() or User.objects.create_superuser(
        "fuzz", password="pw"
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.usefixtures("ledger_data")
@settings(FUZZ, max_examples=40)  # each renders the ledger's list: 0.3 s
@given(
    action=st.one_of(st.sampled_from(ACTION_NAMES), form_text),
    selected=st.lists(st.one_of(st.integers(-3, 10**12).map(str), form_text), max_size=4),
    extra=st.dictionaries(
        st.sampled_from(["confirmed", "post", "next", "from_step", "index", "select_across"]),
        form_text,
        max_size=3,
    ),
)
def test_admin_action_posts_answer_a_page_never_a_500(
    action: str, selected: list[str], extra: dict[str, Any]
) -> None:
    with transaction.atomic():
        client = operator()
        response = client.post(
            reverse(CHANGELIST), {"action": action, "_selected_action": selected, **extra}
        )
        assert response.status_code in (200, 302), (response.status_code, action, selected)
        transaction.set_rollback(True)
