"""Streamed replies (``stream_reply``) through runworker against the fake Open API's CardKit,
on PostgreSQL, measured in one run:

- requests per streamed answer and ledger writes per update, for an answer of --tokens tokens
  written at a model's pace (--pace seconds a token; 0.02 is 50 tokens a second);
- streamed answers per second at 1 process x 4 slots, the tokens written at once (the
  bookkeeping's own cost), beside the same card made by bare CardKit calls with the same
  coalescing and spacing and no ledger (``bench.reply_stream_raw``), in alternating rounds.

    .venv/bin/python bench/streams.py [--answers 200] [--tokens 100] [--paced 40]
                                      [--pace 0.02] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from _setup import django_setup, fresh_postgres, median, reproduce
from worker import throughput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--paced", type=int, default=40, help="answers of the paced run")
    parser.add_argument("--pace", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    url = fresh_postgres("bench_streams")
    django_setup(url)
    from tests.support.fake_feishu import FakeFeishu

    stats = Path(tempfile.mkdtemp()) / "streams.txt"
    base = {
        "FEISHU_APP_ID": "cli_bench",
        "FEISHU_APP_SECRET": "bench-secret",
        "BENCH_STREAM_TOKENS": str(args.tokens),
        "BENCH_STREAM_FILE": str(stats),
    }
    figures: dict[str, list[float]] = {"ledger": [], "no_limits": [], "raw": []}
    # the ledger without Feishu's message limits (the app's 50/s, the chat's 5/s tokens)
    no_limits = {
        "DJANGO_SETTINGS_MODULE": "tests.support.settings_json",
        "FEISHU_INBOX_JSON": json.dumps(
            {"FEISHU_RATE_LIMITS": {"chat": None, "user": None, "app": None}}
        ),
    }
    with FakeFeishu(apps={"cli_bench": "bench-secret"}) as fake:
        env = {**base, "FEISHU_DOMAIN": fake.url, "BENCH_STREAM_PACE": str(args.pace)}
        throughput(url, 1, 4, args.paced, "bench.reply_stream", env)
        paced = [tuple(map(int, line.split())) for line in stats.read_text().splitlines()]
        cards = [c for c in fake.cardkit.cards.values() if c.message_id]
        card_requests = len(fake.cardkit.requests)
        message_requests = len(fake.requests)
        assert len(paced) == len(cards) == args.paced, (len(paced), len(cards))
        assert all(c.most_in_a_second() <= 10 for c in cards)
        env["BENCH_STREAM_PACE"] = "0"
        for r in range(args.rounds):
            for kind, event_type, extra in (
                ("ledger", "bench.reply_stream", {}),
                ("no_limits", "bench.reply_stream", no_limits),
                ("raw", "bench.reply_stream_raw", {}),
            ):
                rate = throughput(url, 1, 4, args.answers, event_type, {**env, **extra})
                figures[kind].append(rate)
                print(f"round {r + 1}: {kind}: {rate:,.1f} answers/s")
    operations = sum(p[0] for p in paced)
    writes = sum(p[2] for p in paced)
    requests = card_requests + message_requests
    result = {
        "paced": {
            "answers": args.paced,
            "tokens": args.tokens,
            "pace_s": args.pace,
            "requests_per_answer": requests / args.paced,
            "card_operations_per_answer": operations / args.paced,
            # beside one write per operation: the card's creation and its message id
            "ledger_writes_per_operation": (writes - 2 * args.paced) / operations,
        },
        "answers_per_s_1x4": {k: median(v) for k, v in figures.items()},
        "rounds": figures,
    }
    print(json.dumps(result, indent=2))
    rates = result["answers_per_s_1x4"]
    ledger_rate, free_rate, raw_rate = rates["ledger"], rates["no_limits"], rates["raw"]
    p = result["paced"]
    print(
        f"an answer of {args.tokens} tokens at {1 / args.pace:g} tokens/s: "
        f"{p['requests_per_answer']:.1f} requests ({p['card_operations_per_answer']:.1f} card "
        f"operations after create), {p['ledger_writes_per_operation']:.2f} ledger writes per "
        "operation"
    )
    print(
        f"streamed answers/s at 1 x 4, tokens at once: {ledger_rate:,.1f} with the ledger and "
        f"Feishu's limits, {free_rate:,.1f} with the ledger alone, {raw_rate:,.1f} by bare "
        f"calls (ratio {free_rate / raw_rate:.2f}: "
        f"{1000 * 4 / free_rate - 1000 * 4 / raw_rate:.1f} ms more per answer per slot)"
    )
    print(f"reproduce: {reproduce()}; this machine's speed swings: compare within one run")


if __name__ == "__main__":
    main()
