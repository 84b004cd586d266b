"""One HTTP POST to a receiver, bounded in time and in what it reads.

``post(url, body, headers, timeout=…)`` never raises for what the receiver does: it returns a
``Sent`` with the status (or None: no answer), the first KiB of the body, ``Retry-After`` and
how long it took. Its bounds, whatever the receiver does:

- time: the whole request (the name's lookup, connect, TLS, send, the answer's head and first
  KiB) ends at ``timeout`` seconds: each socket operation waits at most what is left, and a
  timer shuts the socket down at the deadline, so a receiver that trickles bytes cannot
  stretch it;
- size: the status line and headers are read by ``http.client`` (65,536 bytes a line, 100
  headers), the body up to ``READ_LIMIT`` bytes, and the connection is then closed unread;
- redirects are never followed (a 3xx is an answer like any other: not accepted);
- the address: each address the name resolves to is checked when ``allow_private`` is off (a
  name that resolves to the site's own network is refused at send time too, not only when the
  endpoint was added), and the connection goes to the checked address.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from urllib.parse import urlsplit

#: What is kept of an answer's body (the admin shows it), and all that is read of it.
READ_LIMIT = 1024


@dataclass(frozen=True)
class Sent:
    status: int | None  # None: no answer (timeout, connection refused or reset, refused address)
    body: str = ""
    retry_after: str | None = None
    seconds: float = 0.0
    error: str = ""
    timed_out: bool = False


def is_public(address: str) -> bool:
    """Whether an IP address is on the public internet (not private, loopback, link-local,
    multicast, reserved or unspecified; an IPv4-mapped IPv6 address as its IPv4 one)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request reached its timeout")
        return left


#: Name lookups run here, so that a slow resolver counts against the request's deadline too
#: (``getaddrinfo`` itself cannot be interrupted: a lookup past it finishes unread).
_resolver = ThreadPoolExecutor(max_workers=8, thread_name_prefix="feishu_inbox-webhook-dns")
_tls: list[ssl.SSLContext] = []


def _tls_context() -> ssl.SSLContext:
    """The system's trust store, loaded once per process."""
    if not _tls:
        _tls.append(ssl.create_default_context())
    return _tls[0]


def _connect(
    host: str, port: int, deadline: _Deadline, allow_private: bool
) -> tuple[socket.socket, str]:
    """A socket connected to one of ``host``'s checked addresses."""
    lookup = _resolver.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    try:
        found = lookup.result(timeout=deadline.left())
    except FutureTimeout:
        raise TimeoutError(f"looking up {host} took longer than the request's timeout") from None
    last: Exception | None = None
    for family, kind, proto, _, address in found:
        if not allow_private and not is_public(str(address[0])):
            last = PermissionError(
                f"{host} resolves to {address[0]}, a private address "
                "(FEISHU_INBOX['WEBHOOK_ALLOW_PRIVATE'] is off)"
            )
            continue
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left())
            sock.connect(address)
            return sock, str(address[0])
        except OSError as exc:
            sock.close()
            last = exc
    raise last or OSError(f"{host} resolves to no address")


def post(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    timeout: float,
    allow_private: bool = False,
) -> Sent:
    """POST ``body`` to ``url`` (see the module)."""
    started = time.monotonic()
    deadline = _Deadline(timeout)
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    sock: socket.socket | None = None
    timer: threading.Timer | None = None
    try:
        sock, _ = _connect(host, port, deadline, allow_private)
        holder = [sock]  # the socket the request uses now (the TLS one once wrapped)
        timer = threading.Timer(deadline.left(), _shut, (holder,))
        timer.daemon = True
        timer.start()
        if parts.scheme == "https":
            sock.settimeout(deadline.left())
            sock = holder[0] = _tls_context().wrap_socket(sock, server_hostname=host)
        conn = http.client.HTTPConnection(host, port, timeout=deadline.left())
        conn.sock = sock
        sock.settimeout(deadline.left())
        conn.putrequest("POST", path, skip_accept_encoding=True)
        sent_headers = {
            "content-type": "application/json",
            "content-length": str(len(body)),
            "user-agent": "feishu-inbox-webhooks",
            "connection": "close",
            **headers,
        }
        for name, value in sent_headers.items():
            conn.putheader(name, value)
        conn.endheaders(body)
        sock.settimeout(deadline.left())
        response = conn.getresponse()
        sock.settimeout(deadline.left())
        head = response.read(READ_LIMIT)  # never more: the rest is not read
        return Sent(
            status=response.status,
            body=head.decode("utf-8", errors="replace"),
            retry_after=response.getheader("retry-after"),
            seconds=time.monotonic() - started,
        )
    except TimeoutError as exc:
        return Sent(None, seconds=time.monotonic() - started, error=_said(exc), timed_out=True)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        late = time.monotonic() - started >= timeout
        return Sent(None, seconds=time.monotonic() - started, error=_said(exc), timed_out=late)
    finally:
        if timer is not None:
            timer.cancel()
        if sock is not None:
            sock.close()


def _shut(holder: list[socket.socket]) -> None:
    """The deadline: whatever the request waits on returns at once."""
    with contextlib.suppress(OSError):
        holder[0].shutdown(socket.SHUT_RDWR)


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]
