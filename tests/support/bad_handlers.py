"""Invalid handler registrations: the worker must refuse to start and list every problem."""

from __future__ import annotations

import feishu_inbox
from feishu_inbox import Event


@feishu_inbox.handler("test.twice")
def first(event: Event) -> None:
    pass


@feishu_inbox.handler("test.twice")
def second(event: Event) -> None:
    pass


feishu_inbox.handler("test.not_callable")("I am a string")  # type: ignore[arg-type]
