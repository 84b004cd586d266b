"""A webhook receiver, as a site's customer would write one, run as a process of its own:

    python -m tests.support.webhook_receiver --port P --secret whsec_… --log FILE [--mode M]

Every request is verified with the ``standardwebhooks`` package (against each ``--secret``:
the receiver may hold the old or the new one of a rotation), independent of feishu_inbox's
own signing. It deduplicates on ``webhook-id`` as Standard Webhooks tells receivers to (across
restarts), and writes one JSON line per request to ``--log``: the id, its key and sequence
from the body, which secrets verified it, whether the id was new, the mode.

Modes: ``ok`` (2xx), ``gone`` (410), ``reject`` (400), ``error`` (500), ``sleep`` (sleeps
``--sleep`` s before answering), ``redirect`` (302 to another URL), ``trickle`` (a 200 whose
body comes a byte every 0.2 s), ``huge`` (200 with a 1 GiB body it streams out), ``drop``
(processes the request, then closes the connection without answering on ``--drop`` of the
requests, seeded). A file ``FILE.mode`` next to the log, when present, holds the mode to use
instead (a test switches it while it runs).
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

GIB = 1024**3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret", action="append", required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--mode", default="ok")
    parser.add_argument("--drop", type=float, default=0.0)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    hooks = [(s, Webhook(s)) for s in args.secret]
    # The ids it accepted, kept in its log as a real receiver keeps them in its database: a
    # restarted receiver still deduplicates what it accepted before.
    seen: set[str] = set()
    if args.log.exists():
        for line in args.log.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if row.get("accepted"):
                seen.add(row["id"])
    lock = threading.Lock()
    chance = random.Random(args.seed)
    mode_file = Path(f"{args.log}.mode")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *a: object) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            verified = []  # each secret this request verifies with (by its last characters)
            for secret, hook in hooks:
                try:
                    hook.verify(body, headers)
                except WebhookVerificationError:
                    continue
                verified.append(secret[-6:])
            mode = mode_file.read_text().strip() if mode_file.exists() else args.mode
            msg_id = headers.get("webhook-id", "")
            try:
                data = json.loads(body)["data"]
            except (ValueError, KeyError, TypeError):
                data = {}
            accepting = bool(verified) and mode in ("ok", "drop")
            with lock:
                new = msg_id not in seen
                if accepting:
                    seen.add(msg_id)
                dropped = mode == "drop" and chance.random() < args.drop
                line = {
                    "id": msg_id,
                    "key": data.get("key") if isinstance(data, dict) else None,
                    "seq": data.get("seq") if isinstance(data, dict) else None,
                    "verified": verified,
                    "signatures": len(headers.get("webhook-signature", "").split()),
                    "new": new,
                    "accepted": accepting and new,
                    "mode": mode,
                    "dropped": dropped,
                    "timestamp": headers.get("webhook-timestamp"),
                    "at": time.time(),
                }
                with args.log.open("a") as f:
                    f.write(json.dumps(line) + "\n")
            if not verified:
                self._answer(401, b"bad signature")
            elif mode == "drop" and dropped:  # processed; the answer is lost
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
            elif mode in ("ok", "drop"):
                self._answer(200, b'{"ok":true}')
            elif mode == "gone":
                self._answer(410, b"gone")
            elif mode == "reject":
                self._answer(400, b"bad payload: " + b"x" * 5000)
            elif mode == "error":
                self._answer(500, b"oops")
            elif mode == "sleep":
                time.sleep(args.sleep)  # the receiver's own slowness, what the test is about
                self._answer(200, b"late")
            elif mode == "redirect":
                self.send_response(302)
                self.send_header("location", "http://127.0.0.1:9/elsewhere")
                self.send_header("content-length", "0")
                self.end_headers()
            elif mode == "trickle":  # a 200 whose body comes a byte every 0.2 s
                self.send_response(200)
                self.send_header("content-length", "1024")
                self.end_headers()
                try:
                    for _ in range(1024):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(0.2)  # the receiver's own slowness, what the test is about
                except OSError:
                    pass
                self.close_connection = True
            elif mode == "huge":
                self.send_response(200)
                self.send_header("content-length", str(GIB))
                self.end_headers()
                chunk = b"x" * 65536
                written = 0
                try:
                    for _ in range(GIB // len(chunk)):
                        self.wfile.write(chunk)
                        written += len(chunk)
                except OSError:  # the sender stopped reading and closed: as it should
                    pass
                with lock, args.log.open("a") as f:
                    f.write(json.dumps({"id": msg_id, "huge_written": written}) + "\n")
                self.close_connection = True

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
