"""Invalid schedule declarations: the worker must refuse to start and list every problem."""

from __future__ import annotations

import feishu_inbox
from feishu_inbox import Event


@feishu_inbox.schedule("0 9 * *", tz="Asia/Shanghai")  # four fields
def short_cron(event: Event) -> None:
    pass


@feishu_inbox.schedule("0 9 * * *", tz="Mars/Olympus_Mons", catch_up="sometimes")
def nowhere(event: Event) -> None:
    pass


@feishu_inbox.schedule("0 9 * * *", max_catch_up=0, name="digest")
def digest(event: Event) -> None:
    pass


@feishu_inbox.schedule("0 10 * * *", name="twice")
def first(event: Event) -> None:
    pass


@feishu_inbox.schedule("0 11 * * *", name="twice")
def second(event: Event) -> None:
    pass
