"""Idempotent effects (SPEC §3 Effects): the key a remote side deduplicates by, and its window.

    with feishu_inbox.effect("reply", idempotent_for=timedelta(hours=1)) as key:
        send(..., uuid=key)

The key is stable for one job and effect name across attempts, workers and an operator's
requeue or reconcile; a replay (an operator asking for the work to happen again) gets new keys.
It is derived from the job's id, its event, its replay generation and the effect's name, and is
at most 50 characters (Feishu's ``uuid`` limit).

The window is the remote side's promise: a request repeated with the same key within it acts
at most once. The ledger counts it from the first start of the job's idempotent effects (the
database's clock; the request leaves after that, so the remote side's window starts later) and
stops trusting it ``margin`` before its end, so a re-sent request arrives inside it even when
it takes its whole timeout. Until then a failure, a crash or a lost lease inside such an effect
sends the job to ``retry_wait``; past it the job is ``unknown``, as any effect without a key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import IdempotencyWindowPassed, LedgerError

#: Feishu's uuid: at most 50 characters, one message per uuid within an hour.
KEY_MAX_LENGTH = 50
FEISHU_UUID_WINDOW = timedelta(hours=1)
#: The default margin: a tenth of the window, at most five minutes (an hour's window is
#: trusted for 55 minutes). It must exceed how long one try of the effect can take.
LONGEST_DEFAULT_MARGIN = timedelta(minutes=5)
NAME_MAX_LENGTH = 64  # EventJob.idempotent_effect


@dataclass(frozen=True)
class Idempotent:
    """An idempotent effect: its name (part of its key), window and margin."""

    name: str
    window: timedelta
    margin: timedelta

    @classmethod
    def of(
        cls,
        name: object,
        window: object,
        margin: object = None,
        *,
        longest: timedelta | None = None,
    ) -> Idempotent:
        """Checked arguments of ``effect(name, idempotent_for=window, margin=margin)``;
        ``LedgerError`` naming every problem (nothing was recorded). ``longest``: the longest
        window the remote side offers (Feishu's hour)."""
        problems = []
        if not isinstance(name, str) or not 1 <= len(name) <= NAME_MAX_LENGTH:
            problems.append(
                f"an idempotent effect needs a name of 1 to {NAME_MAX_LENGTH} characters, "
                f"unique within its handler (got {name!r})"
            )
        if not isinstance(window, timedelta) or window <= timedelta(0):
            problems.append(f"idempotent_for must be a positive timedelta (got {window!r})")
        elif longest is not None and window > longest:
            problems.append(
                f"idempotent_for is {window}, longer than the remote side's window of {longest}"
            )
        if margin is None and isinstance(window, timedelta):
            margin = default_margin(window)
        if not isinstance(margin, timedelta) or margin < timedelta(0):
            problems.append(f"margin must be a timedelta >= 0 (got {margin!r})")
        elif isinstance(window, timedelta) and margin >= window:
            problems.append(f"margin ({margin}) must be shorter than the window ({window})")
        if problems:
            raise LedgerError(
                "effect() was refused: " + "; ".join(problems) + ".",
                fix="Fix the call; no effect was recorded.",
            )
        assert isinstance(name, str) and isinstance(window, timedelta)
        assert isinstance(margin, timedelta)
        return cls(name, window, margin)


def default_margin(window: timedelta) -> timedelta:
    """A tenth of the window, at most five minutes."""
    return min(LONGEST_DEFAULT_MARGIN, window / 10)


def window_params(idempotent: Idempotent | None) -> dict[str, Any]:
    """The store's parameters for a beginning effect (all None: it has no key)."""
    if idempotent is None:
        return {"name": None, "window": None, "until_seconds": None}
    return {
        "name": idempotent.name,
        "window": idempotent.window.total_seconds(),
        "until_seconds": (idempotent.window - idempotent.margin).total_seconds(),
    }


def window_passed(job_id: int, idempotent: Idempotent | None) -> IdempotencyWindowPassed:
    what = f"effect {idempotent.name!r}" if idempotent else "an effect"
    return IdempotencyWindowPassed(
        f"Job {job_id} did not start {what}: its idempotency window has passed, so re-sending "
        "what an earlier attempt may have sent could act twice. The job ends unknown."
    )


def effect_key(*, job_id: int, app: str, event_id: str, generation: int, name: str) -> str:
    """The key of effect ``name`` of a job: ``fi-<job id>-<replay generation>-<digest>``.

    The digest covers the app, the event id and the name, so two ledgers (staging and
    production, or a database restored from a backup) that share a Feishu app and reuse job
    ids still never share a key."""
    digest = hashlib.sha256(f"{app}\0{event_id}\0{name}".encode()).hexdigest()[:14]
    key = f"fi-{job_id}-{generation}-{digest}"
    assert len(key) <= KEY_MAX_LENGTH, key  # 3 + 19 + 1 + 10 + 1 + 14
    return key
