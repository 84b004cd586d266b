"""Admin pages with a million-row ledger on PostgreSQL: time and queries per page.

Fills --rows jobs (mostly completed, with queued, failed and unknown heads blocking chats, as a
busy production ledger looks), then loads each operator page several times through Django's
test client and prints the median time and the number of queries.

    .venv/bin/python bench/admin_pages.py [--rows 1000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from _setup import django_setup, fresh_postgres, reproduce


def fill(rows: int) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO feishu_inbox_eventjob (app, event_id, event_type, dedupe_key,
                partition_key, private_message, payload, status, attempt, received_at,
                available_at, finished_at, worker_id, lease_token, effects_in_flight,
                side_effect_started, effect_uncertain, error_type, error_message, resolution)
            SELECT 'default', 'ev' || g, CASE WHEN g %% 7 = 0 THEN 'card.action.trigger'
                   ELSE 'im.message.receive_v1' END, 'message:om' || g,
                'default:chat:oc_' || (g %% 5000), g %% 11 = 0,
                jsonb_build_object('schema', '2.0', 'event', jsonb_build_object('text', 'hello ' || g)),
                'completed', 1, now() - ((%s - g) * interval '500 ms'),
                now() - ((%s - g) * interval '500 ms'), now() - ((%s - g) * interval '400 ms'),
                'w1', '', 0, TRUE, FALSE, '', '', ''
            FROM generate_series(1, %s) g
            """,
            [rows, rows, rows, rows],
        )
        # The newest job of 40 chats is still unresolved: failed, unknown or queued heads.
        cur.execute(
            """
            WITH latest AS (
                SELECT max(id) AS id, partition_key FROM feishu_inbox_eventjob
                GROUP BY partition_key ORDER BY partition_key LIMIT 40
            )
            UPDATE feishu_inbox_eventjob j SET
                status = (ARRAY['failed', 'unknown', 'queued', 'queued'])[1 + (j.id % 4)],
                error_type = CASE WHEN j.id % 4 < 2 THEN 'TimeoutError' ELSE '' END,
                finished_at = NULL
            FROM latest WHERE j.id = latest.id
            """
        )
        cur.execute(
            """
            INSERT INTO feishu_inbox_partition (key, head_id, head_state, head_due_at)
            SELECT DISTINCT ON (partition_key) partition_key, id, status, available_at
            FROM feishu_inbox_eventjob WHERE NOT (status = 'completed')
            ORDER BY partition_key, id
            """
        )
        cur.execute(
            "INSERT INTO feishu_inbox_partition (key, head_id, head_state, head_due_at) "
            "SELECT DISTINCT partition_key, NULL::bigint, 'idle', NULL::timestamptz "
            "FROM feishu_inbox_eventjob ON CONFLICT (key) DO NOTHING"
        )
        cur.execute("VACUUM ANALYZE feishu_inbox_eventjob")
        cur.execute("ANALYZE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    django_setup(fresh_postgres("fi_bench_admin"))
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    settings.ALLOWED_HOSTS = ["testserver"]
    started = time.perf_counter()
    fill(args.rows)
    print(f"filled {args.rows:,} jobs in {time.perf_counter() - started:.0f} s")
    user = User.objects.create_superuser("bench", password=None)  # force_login: no password
    client = Client()
    client.force_login(user)
    some = connection.cursor()
    some.execute("SELECT id FROM feishu_inbox_eventjob WHERE status = 'unknown' LIMIT 1")
    unknown_id = some.fetchone()[0]
    base = "/admin/feishu_inbox/eventjob/"
    pages = {
        "list": base,
        "list, unknown": base + "?status__exact=unknown",
        "list, blocks its partition": base + "?blocking=yes",
        "list, search partition": base + "?q=default:chat:oc_42",
        "list, page 50": base + "?p=50",
        "list, a month": base + "?received_at__year={y}&received_at__month={m}",
        "detail": base + f"{unknown_id}/change/",
        "dashboard": base + "dashboard/",
        "dashboard data": base + "dashboard/data/",
    }
    now = time.gmtime()
    results = {}
    for label, url in pages.items():
        url = url.format(y=now.tm_year, m=now.tm_mon)
        times = []
        for _ in range(args.repeat):
            with CaptureQueriesContext(connection) as q:
                t = time.perf_counter()
                response = client.get(url)
                times.append((time.perf_counter() - t) * 1000)
            assert response.status_code == 200, (url, response.status_code)
        results[label] = {"median_ms": round(statistics.median(times), 1), "queries": len(q)}
        print(f"{label:<28} {statistics.median(times):7.1f} ms  {len(q):3d} queries   {url}")
    print(json.dumps(results))
    print(f"reproduce: {reproduce()}")


if __name__ == "__main__":
    main()
