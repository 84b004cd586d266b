"""Backfills declared in code, and their registry (a leaf: declarations are made at import).

    @feishu_inbox.backfill(
        "orders.fill_currency",
        Order.objects.filter(currency=None),
        batch_size=1000,
        rows_per_second=5000,
        after="orders.0041_order_currency",      # the migration that adds the column
        before="orders.0042_currency_not_null",  # the migration that needs every row filled
    )
    def fill_currency(batch):                    # a queryset of the batch's rows
        batch.update(currency="CNY")

A batch is the next ``batch_size`` rows of the queryset by primary key after the cursor
(keyset pagination: never ``OFFSET``); the function gets them as a queryset (``takes=
"queryset"``, the default), a list of primary keys (``"pks"``) or of model instances
(``"rows"``). Its writes and the cursor's move commit in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import models

from ..errors import ConfigurationError

TAKES = ("queryset", "pks", "rows")
#: Backfill names are kept in columns (and job event types) of this length.
NAME_LIMIT = 150


def migration_ref(value: object, what: str) -> tuple[str, str] | None:
    """``"app_label.0042_name"`` or ``("app_label", "0042_name")`` as a pair (None: none)."""
    if value is None:
        return None
    if isinstance(value, str) and "." in value:
        app, name = value.split(".", 1)
        return app, name
    if isinstance(value, tuple | list) and len(value) == 2:
        app_label, migration = value
        if isinstance(app_label, str) and isinstance(migration, str):
            return app_label, migration
    raise ConfigurationError(
        f"A backfill's {what} names a migration as 'app_label.0042_name' (got {value!r})."
    )


@dataclass(frozen=True)
class BackfillSpec:
    """One declared backfill (see the module)."""

    name: str
    #: The rows to walk: a queryset, a model (all its rows), or a function returning either.
    source: Any
    work: Callable[[Any], Any]
    batch_size: int = 1000
    #: The pace, for every worker together (through the shared rate buckets): rows or batches
    #: per second (None for both: as fast as the workers go).
    rows_per_second: float | None = None
    batches_per_second: float | None = None
    #: The migration it needs (it may start only once it is applied), and the one that needs
    #: it (``RequireBackfill`` in that migration refuses to apply until it is done).
    after: tuple[str, str] | None = None
    before: tuple[str, str] | None = None
    takes: str = "queryset"
    #: No batch committed for this long while running: stalled (None: BACKFILL_STALL_SECONDS).
    stall_seconds: float | None = None
    #: The environments (FEISHU_INBOX["ENVIRONMENT"]) it may run in; empty: any.
    environments: tuple[str, ...] = ()
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigurationError(f"Backfill {self.name!r}: " + "; ".join(problems) + ".")

    def problems(self) -> list[str]:
        found = []
        if not isinstance(self.name, str) or not 0 < len(self.name) <= NAME_LIMIT:
            found.append(f"its name must be 1 to {NAME_LIMIT} characters")
        if not callable(self.work):
            found.append("its work must be a function of a batch")
        if (
            isinstance(self.batch_size, bool)
            or not isinstance(self.batch_size, int)
            or not (0 < self.batch_size <= 100_000)
        ):
            found.append(f"batch_size must be 1 to 100000 (got {self.batch_size!r})")
        if self.rows_per_second is not None and self.batches_per_second is not None:
            found.append("give rows_per_second or batches_per_second, not both")
        for rate in (self.rows_per_second, self.batches_per_second):
            if rate is not None and (not isinstance(rate, int | float) or rate <= 0):
                found.append(f"a rate must be a positive number (got {rate!r})")
        if self.takes not in TAKES:
            found.append(f"takes must be one of {', '.join(TAKES)} (got {self.takes!r})")
        if self.stall_seconds is not None and not self.stall_seconds > 0:
            found.append(f"stall_seconds must be positive (got {self.stall_seconds!r})")
        return found

    def queryset(self) -> models.QuerySet[Any]:
        source = self.source
        if callable(source) and not isinstance(source, type):
            source = source()
        if isinstance(source, type) and issubclass(source, models.Model):
            return source._default_manager.all()
        if isinstance(source, models.QuerySet):
            return source.all()  # a fresh copy: no result cache shared between batches
        raise ConfigurationError(
            f"Backfill {self.name!r} walks a queryset or a model, not {type(source).__name__}."
        )

    def write_alias(self) -> str:
        """The database its batches read their keys from and write to: the queryset's own
        (``.using()``), else the one the router sends the model's writes to; never a replica
        the router reads from, whose lag would skip the rows it has not caught up with."""
        # A queryset marked for writing names it, as Django's own ``update()`` finds it.
        return self.queryset().select_for_update().db

    @property
    def batches_rate(self) -> float | None:
        """Batches per second (None: no limit)."""
        if self.batches_per_second is not None:
            return float(self.batches_per_second)
        if self.rows_per_second is not None:
            return float(self.rows_per_second) / self.batch_size
        return None


_declared: dict[str, BackfillSpec] = {}


def register(spec: BackfillSpec) -> BackfillSpec:
    """Declare a backfill (again: replace it)."""
    _declared[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    _declared.pop(name, None)


def declared() -> dict[str, BackfillSpec]:
    """Every declared backfill, by name."""
    return dict(sorted(_declared.items()))


def get(name: str) -> BackfillSpec | None:
    return _declared.get(name)


def backfill(
    name: str,
    source: Any,
    *,
    batch_size: int = 1000,
    rows_per_second: float | None = None,
    batches_per_second: float | None = None,
    after: Any = None,
    before: Any = None,
    takes: str = "queryset",
    stall_seconds: float | None = None,
    environments: tuple[str, ...] | list[str] = (),
    description: str = "",
) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Declare the decorated function as the work of backfill ``name`` (see the module)."""

    def declare(work: Callable[[Any], Any]) -> Callable[[Any], Any]:
        register(
            BackfillSpec(
                name=name,
                source=source,
                work=work,
                batch_size=batch_size,
                rows_per_second=rows_per_second,
                batches_per_second=batches_per_second,
                after=migration_ref(after, "after"),
                before=migration_ref(before, "before"),
                takes=takes,
                stall_seconds=stall_seconds,
                environments=tuple(environments),
                description=description or (work.__doc__ or "").strip().split("\n")[0],
            )
        )
        return work

    return declare
