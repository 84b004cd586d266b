"""The plans PostgreSQL caches for the hot path, read from inside the stored functions.

A PL/pgSQL statement is planned for its first five calls with the parameters' values (custom
plans); from then on PostgreSQL keeps one generic plan if it costs no more. These tests run the
functions as a worker does, at 200,000 waiting jobs, and read the plan of the seventh call with
auto_explain (log_nested_statements, at NOTICE level: the plans come back to this connection):
it must be the cached generic one (parameters shown as $1, not values) and stay on the partial
indexes, never scanning the backlog.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection

from feishu_inbox.store.schema import JOB_TABLE, PARTITION_TABLE

# Committed data and new connections: each test's session starts with no plan cached.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("postgres_only")]

WAITING = 200_000
CHATS = 1_000

_COLUMNS = (
    "app, event_id, event_type, dedupe_key, partition_key, private_message, payload, status, "
    "attempt, received_at, available_at, worker_id, lease_token, effects_in_flight, "
    "side_effect_started, effect_uncertain, cancel_requested, has_steps, error_type, "
    "error_message, resolution"
)


def _fill(statistics: str = "analysed") -> None:
    """A chat whose failed head blocks 200,000 queued jobs; 1,000 chats with three queued jobs
    each; 100,000 completed jobs. Inserted directly (set-up only), then, by ``statistics``:
    "analysed"; "one-chat": the job table analysed while only the blocked chat was there (one
    distinct key, as in bench/claim_backlog.py), the worst statistics for the head lookup."""
    insert = (
        f"INSERT INTO {JOB_TABLE} ({_COLUMNS}) SELECT 'default', 'e' || g, 't', 'e' || g, "
        "CASE WHEN g <= %(waiting)s THEN 'blocked' ELSE 'chat-' || (g %% %(chats)s) END, "
        "FALSE, '{}'::jsonb, CASE WHEN g = 1 THEN 'failed' "
        "WHEN g > %(waiting)s + 3 * %(chats)s THEN 'completed' ELSE 'queued' END, "
        "CASE WHEN g = 1 THEN 1 ELSE 0 END, now(), now(), '', '', 0, FALSE, FALSE, FALSE, "
        "FALSE, '', '', '' FROM generate_series(%(first)s, %(last)s) g"
    )
    sizes = {"waiting": WAITING, "chats": CHATS}
    with connection.cursor() as cur:
        cur.execute(insert, {**sizes, "first": 1, "last": WAITING})
        if statistics == "one-chat":
            cur.execute(f"ANALYZE {JOB_TABLE}")
        cur.execute(insert, {**sizes, "first": WAITING + 1, "last": WAITING + 3 * CHATS + 100000})
        heads = (
            "SELECT DISTINCT ON (partition_key) partition_key, id, status, available_at "
            f"FROM {JOB_TABLE} WHERE status <> 'completed' ORDER BY partition_key, id"
        )
        cur.execute(
            f"INSERT INTO {PARTITION_TABLE} (key, head_id, head_state, head_due_at) {heads}"
        )
        cur.execute(f"ANALYZE {PARTITION_TABLE}" if statistics == "one-chat" else "ANALYZE")
    connection.close()  # a new session: no plan cached yet


@contextmanager
def nested_plans() -> Iterator[list[str]]:
    """The plans of every statement run inside functions, as auto_explain reports them."""
    plans: list[str] = []
    connection.ensure_connection()
    raw = connection.connection

    def keep(diagnostic: object) -> None:
        plans.append(str(getattr(diagnostic, "message_primary", "")))

    with connection.cursor() as cur:
        cur.execute("LOAD 'auto_explain'")
        for setting, value in (
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_nested_statements", "on"),
            ("auto_explain.log_verbose", "on"),
            ("auto_explain.log_level", "notice"),
            ("client_min_messages", "notice"),
        ):
            cur.execute("SELECT set_config(%s, %s, false)", [setting, value])
    raw.add_notice_handler(keep)
    try:
        yield plans
    finally:
        raw.remove_notice_handler(keep)
        with connection.cursor() as cur:
            cur.execute("SELECT set_config('auto_explain.log_min_duration', '-1', false)")


def _plan_of(plans: list[str], marker: str) -> str:
    found = [p for p in plans if marker in p and "Query Text" in p]
    assert found, f"no plan with {marker!r} among {len(plans)}"
    return found[-1]


#: The claims, by function: the unfiltered one, a `runworker --queue` worker's and a
#: `runworker --exclude-queues` worker's.
CLAIMS = {
    "feishu_inbox_claim": "SELECT id, partition_key FROM feishu_inbox_claim('w', %s, 60, 1)",
    "feishu_inbox_claim_prefixed": (
        "SELECT id, partition_key "
        "FROM feishu_inbox_claim_prefixed('w', %s, 60, 1, ARRAY['chat-'], FALSE)"
    ),
    "feishu_inbox_claim_prefixed excluding": (
        "SELECT id, partition_key "
        "FROM feishu_inbox_claim_prefixed('w', %s, 60, 1, ARRAY['chat-1', 'task:'], TRUE)"
    ),
}


def _claim_and_finish_seven_times(
    function: str = "feishu_inbox_claim",
) -> tuple[list[str], list[str], list[str]]:
    """The plans of the claim and of the head lookup, call by call (one new session), and
    the claimed jobs' chats."""
    claims, heads, keys = [], [], []
    try:
        for i in range(7):  # five custom plans, then the cached one
            with nested_plans() as plans, connection.cursor() as cur:
                cur.execute(CLAIMS[function], [f"t{i}"])
                job_id, key = cur.fetchone()
                keys.append(key)
                cur.execute(
                    "SELECT feishu_inbox_end_attempt(%s, 'w', %s, %s, FALSE, '', '', 0, 0)",
                    [job_id, f"t{i}", key],
                )
                assert cur.fetchone()[0] == "completed"
            claims.append(_plan_of(plans, "WITH picked AS"))
            heads.append(_plan_of(plans, "SELECT j.id, j.status, j.available_at"))
    finally:
        connection.close()  # its session's settings and plans go with it
    return claims, heads, keys


@pytest.fixture
def _no_autovacuum(postgres_only: None) -> Iterator[None]:
    """The tables keep the statistics the test gave them (autovacuum would analyse them)."""
    tables = (JOB_TABLE, PARTITION_TABLE)
    with connection.cursor() as cur:
        for table in tables:
            cur.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    yield
    with connection.cursor() as cur:
        for table in tables:
            cur.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


@pytest.mark.usefixtures("_no_autovacuum")
@pytest.mark.parametrize("statistics", ["analysed", "one-chat"])
def test_cached_plans_of_claim_and_end_attempt_stay_on_the_partial_indexes(
    statistics: str,
) -> None:
    _fill(statistics)
    claims, heads, _ = _claim_and_finish_seven_times()
    # The first calls are planned with their values; the seventh runs the cached plan, where
    # the worker's id and token (claim) and the chat (head) are parameters.
    assert "'w'::" in claims[0] and "'w'::" not in claims[-1], claims[-1]
    assert re.search(r"\$1, \$2\b", claims[-1]), claims[-1]
    assert "'chat-" in heads[0], heads[0]
    assert re.search(r"\(j\.partition_key\)::text >= \$\d+\)", heads[-1]), heads[-1]
    claim, head = claims[-1], heads[-1]
    # The claim reads the claimable heads' partial index in head order, never the backlog.
    assert "Index Scan using feishu_inbox_part_claimable" in claim, claim
    assert "Seq Scan" not in claim and "Sort" not in claim, claim  # priority: index order
    # The new head: the first entry of the chat in the partial index of unresolved jobs.
    assert "Index Scan using feishu_inbox_job_unresolved" in head, head
    assert "Seq Scan" not in head and "Sort" not in head, head


def _enqueue_in_turn(jobs: int = 10_000, chats: int = CHATS) -> None:
    """Jobs enqueued as a site receives them, each chat's in turn (chat-1, chat-2, ...), so
    the partition rows lie in no key order; then analysed (as bench/worker.py fills)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM (SELECT feishu_inbox_enqueue('default', 'e' || g, 't', "
            "'e' || g, 'chat-' || (g %% %s), FALSE, '{}'::jsonb, NULL::integer) "
            "FROM generate_series(1, %s) g) s",
            [chats, jobs],
        )
        cur.execute("ANALYZE")
    connection.close()  # a new session: no plan cached yet


@pytest.mark.usefixtures("_no_autovacuum")
@pytest.mark.parametrize("statistics", ["analysed", "one-chat", "small, in turn"])
def test_cached_plans_of_a_batchs_finishes_find_rows_by_key(statistics: str) -> None:
    """feishu_inbox_end_attempts (0028) ends a batch's jobs in three statements over arrays,
    always with generic plans (its plan_cache_mode, whatever the session's): from the first
    call on, they find the partition rows and the jobs by their primary keys and each new
    head through the partial index of unresolved jobs: never a scan of the backlog, of every
    chat, or of the status index's running entries (dead ones pile up there between
    vacuums), whatever the statistics. "small, in turn": a thousand partition rows in no key
    order, where a plan costed for ten keys scanned them all (0029: enable_seqscan off)."""
    if statistics == "small, in turn":
        _enqueue_in_turn()
    else:
        _fill(statistics)
    planned: list[tuple[str, str, str]] = []
    batch = (
        "SELECT finished_id, ended_status, (claimed).id, (claimed).partition_key "
        "FROM feishu_inbox_finish_batch('w', %s, %s, %s, %s, %s, 3, 60, NULL)"
    )
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT id, partition_key FROM feishu_inbox_claim('w', 't0', 60, 3)")
            running = [(job_id, key, "t0") for job_id, key in cur.fetchall()]
            cur.execute("SELECT set_config('plan_cache_mode', 'force_custom_plan', false)")
        for i in range(1, 4):
            ids, keys, tokens = (list(column) for column in zip(*running, strict=True))
            with nested_plans() as plans, connection.cursor() as cur:
                cur.execute(batch, [ids, tokens, keys, [""] * len(ids), f"t{i}"])
                rows = cur.fetchall()
            assert [(r[0], r[1]) for r in rows[:3]] == [(j, "completed") for j in ids], rows
            running = [(r[2], r[3], f"t{i}") for r in rows[3:]]
            assert len(running) == 3, rows
            planned.append(
                (
                    _plan_of(plans, "FROM feishu_inbox_partition WHERE key = ANY"),
                    _plan_of(plans, "WITH ended AS (UPDATE"),
                    _plan_of(
                        plans, "SET (head_id, head_state, head_due_at, head_priority, head_tenant)"
                    ),
                )
            )
    finally:
        connection.close()  # its session's settings and plans go with it
    for lock, end, head in planned:
        assert "'w'::" not in end and "$1" in end, end  # generic from the first call on
        assert _reads_by(lock, "feishu_inbox_partition_pkey"), lock
        assert _reads_by(end, "feishu_inbox_eventjob_pkey"), end
        assert _reads_by(head, "feishu_inbox_job_unresolved"), head
        assert _reads_by(head, "feishu_inbox_partition_pkey"), head
        for plan in (lock, end, head):
            assert "Seq Scan" not in plan and "Hash" not in plan, plan


def _reads_by(plan: str, index: str) -> bool:
    """The plan finds rows through ``index``: a plain index scan, or a bitmap of its entries
    (the planner takes either for a few keys of an array, as its costs of the moment say;
    both read the keys asked for, never the whole index)."""
    return f"Index Scan using {index}" in plan or f"Bitmap Index Scan on {index}" in plan


def test_a_claim_of_several_is_still_planned_for_its_limit() -> None:
    """LIMIT p_limit stays planned per call: a generic plan would guess the limit and scan
    every partition; with its value the plan reads the claimable index."""
    _fill()
    with nested_plans() as plans, connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM feishu_inbox_claim('w', 't', 60, 4)")
        assert cur.fetchone()[0] == 4
    connection.close()
    claim = _plan_of(plans, "WITH picked AS")
    assert "Index Scan using feishu_inbox_part_claimable" in claim, claim
    assert "Seq Scan on public.feishu_inbox_partition" not in claim.split("CTE part")[0], claim


@pytest.mark.parametrize(
    "claim", ["feishu_inbox_claim_prefixed", "feishu_inbox_claim_prefixed excluding"]
)
def test_the_cached_claim_of_a_queue_worker_takes_priority_in_index_order(claim: str) -> None:
    """feishu_inbox_claim_prefixed (runworker --queue, and --exclude-queues) has its own
    LIMIT 1 branch: its seventh call runs the cached generic plan, on the claimable index in
    (priority, head) order with no sort, and takes the higher-priority heads first."""
    _fill()
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {PARTITION_TABLE} SET head_priority = 7 WHERE key IN ('chat-5', 'chat-9')"
        )
        cur.execute(
            f"UPDATE {JOB_TABLE} SET priority = 7 WHERE id IN "
            f"(SELECT head_id FROM {PARTITION_TABLE} WHERE head_priority = 7)"
        )
    connection.close()
    claims, _, keys = _claim_and_finish_seven_times(claim)
    assert sorted(keys[:2]) == ["chat-5", "chat-9"], keys  # priority 7 before the others
    if claim.endswith("excluding"):
        assert not any(k.startswith("chat-1") for k in keys), keys
    assert re.search(r"\$1, \$2\b", claims[-1]) and "'w'::" not in claims[-1], claims[-1]
    assert "Index Scan using feishu_inbox_part_claimable" in claims[-1], claims[-1]
    assert "Seq Scan" not in claims[-1] and "Sort" not in claims[-1], claims[-1]


@pytest.fixture
def _no_statistics(_no_autovacuum: None) -> None:
    """The tables as a new site's are: never analysed (the earlier tests' statistics go; the
    test database's superuser may delete them, as ANALYZE would rewrite them)."""
    with connection.cursor() as cur:
        cur.execute(
            "DELETE FROM pg_statistic WHERE starelid IN (%s::regclass, %s::regclass)",
            [JOB_TABLE, PARTITION_TABLE],
        )
        cur.execute(
            "UPDATE pg_class SET reltuples = -1, relpages = 0 WHERE oid IN "
            "(%s::regclass, %s::regclass)",
            [JOB_TABLE, PARTITION_TABLE],
        )


@pytest.mark.usefixtures("_no_statistics")
@pytest.mark.parametrize("function", ["feishu_inbox_claim", "feishu_inbox_claim_prefixed"])
def test_a_new_sites_claim_never_sorts_its_partitions(function: str) -> None:
    """Before autovacuum first analyses the tables (a new site's first minutes, and the
    benchmarks), the planner's defaults expect a claimable partition or two, so reading
    every due one through feishu_inbox_part_due and sorting them looks cheaper than the
    claimable index in order: a claim then costs a sort of every waiting chat (0.5 ms at
    1,000 chats in bench/throughput.py, growing with the chats). The claim functions forbid
    sorts and sequential scans (their SET clauses), so every plan reads the index in order."""
    with connection.cursor() as cur:
        for i in range(2000):  # as the webhook stores them: 2 events in each of 1,000 chats
            cur.execute(
                "SELECT * FROM feishu_inbox_enqueue('default', %s, 't', %s, %s, FALSE, "
                "'{}'::jsonb, NULL)",
                [f"e{i}", f"e{i}", f"chat-{i % CHATS}"],
            )
    claims, _, _ = _claim_and_finish_seven_times(function)
    for claim in (claims[0], claims[-1]):  # a custom plan and the cached one
        assert "Index Scan using feishu_inbox_part_claimable" in claim, claim
        assert "Sort" not in claim and "Seq Scan" not in claim, claim


def test_the_lease_expiry_scan_reads_only_the_running_jobs() -> None:
    """expired_leases (every worker's sweep) reads the running jobs through the status index,
    in id order, never the backlog: at 200,000 waiting jobs its plan is one index range."""
    from feishu_inbox.store import store

    _fill()
    with connection.cursor() as cur:
        for i in range(3):
            cur.execute(CLAIMS["feishu_inbox_claim"], [f"t{i}"])
        sql = store().queries["expired_leases"].sql  # type: ignore[attr-defined]
        cur.execute(f"EXPLAIN {sql}", {"limit": 100})
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "feishu_inbox_job_status" in plan and "Seq Scan" not in plan, plan
    assert "Sort" not in plan, plan


@pytest.mark.usefixtures("_no_autovacuum")
@pytest.mark.parametrize("function", list(CLAIMS))
def test_a_claim_finds_its_jobs_by_id_when_most_jobs_are_not_claimable(function: str) -> None:
    """100,000 jobs that wait (SPEC §9e) and 100,000 completed ones, analysed while no job was
    queued (a quiet hour); then 1,000 chats of three queued jobs arrive. The statistics say
    queued jobs are rare, so the status index looks selective: before migration 0033 the
    claim's update of its jobs was a join the planner served from that index, reading every
    queued job per claim (bench/waits.py: 1.4 to 1.8 times the cost). It must find its jobs by
    primary key."""
    rows = (
        f"INSERT INTO {JOB_TABLE} ({_COLUMNS}) SELECT 'default', 'e' || g, 't', 'e' || g, "
        "CASE WHEN %(queued)s THEN 'chat-' || (g %% %(chats)s) ELSE 'w-' || g END, "
        "FALSE, '{}'::jsonb, CASE WHEN %(queued)s THEN 'queued' "
        "WHEN g %% 2 = 0 THEN 'waiting' ELSE 'completed' END, "
        "0, now(), now(), '', '', 0, FALSE, FALSE, FALSE, FALSE, '', '', '' "
        "FROM generate_series(%(first)s, %(last)s) g"
    )
    with connection.cursor() as cur:
        cur.execute(rows, {"chats": CHATS, "queued": False, "first": 1, "last": 200_000})
        cur.execute("ANALYZE")
        last = 200_000 + 3 * CHATS
        cur.execute(rows, {"chats": CHATS, "queued": True, "first": 200_001, "last": last})
        cur.execute(
            f"INSERT INTO {PARTITION_TABLE} (key, head_id, head_state, head_due_at) "
            "SELECT DISTINCT ON (partition_key) partition_key, id, status, available_at "
            f"FROM {JOB_TABLE} WHERE status = 'queued' ORDER BY partition_key, id"
        )
        cur.execute(f"ANALYZE {PARTITION_TABLE}")
    connection.close()
    claims, _, _ = _claim_and_finish_seven_times(function)
    for claim in (claims[0], claims[-1]):  # a custom plan, and the cached one
        assert "feishu_inbox_job_status" not in claim, claim
        assert "Index Scan using feishu_inbox_eventjob_pkey" in claim, claim
