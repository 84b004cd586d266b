"""Test data, created through the ledger so the partition mirror stays true."""

from __future__ import annotations

import itertools
from typing import Any

import factory

from feishu_inbox import ledger
from feishu_inbox.models import EventJob

_seq = itertools.count(1)


class EventJobFactory(factory.Factory):
    """``EventJobFactory(partition_key="chat-1")`` enqueues one event and returns the job."""

    class Meta:
        model = EventJob

    event_id = factory.LazyFunction(lambda: f"ev-{next(_seq)}")
    event_type = "im.message.receive_v1"
    partition_key = "chat-1"
    payload = factory.LazyAttribute(lambda o: {"event_id": o.event_id, "text": "hello"})
    private_message = False
    app = "default"

    @classmethod
    def _create(cls, model_class: type[EventJob], *args: Any, **kwargs: Any) -> EventJob:
        result = ledger.enqueue(**kwargs)
        return model_class.objects.get(pk=result.job_id)

    @classmethod
    def _build(cls, model_class: type[EventJob], *args: Any, **kwargs: Any) -> EventJob:
        raise NotImplementedError("jobs exist only in the ledger: use EventJobFactory()")
