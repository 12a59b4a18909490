"""A TCP relay in front of the S3 server that loses or replaces the reply to a picked request.

Everything else is forwarded both ways untouched, so the store under test talks to the real
server (SeaweedFS) through it. Once armed, the relay either forwards the picked request and
closes the client's connection at the server's first byte of reply (the request ran, its
reply is lost: the worst moment for a client), or answers it itself with a given reply
without forwarding it (a throttled or failing server, which SeaweedFS cannot be made to be
on cue). A request is picked by its first chunk, which holds its request line and headers.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from tests.helpers.relay import Relay, close_socket

Picks = Callable[[bytes], bool]


def request_to(method: str, path_part: str, *headers: str) -> Picks:
    """Picks a request of `method` whose request line holds `path_part` and whose headers hold
    each of `headers` (case-insensitive)."""
    line = re.compile(rb"^" + method.encode() + rb" [^ ]*" + re.escape(path_part.encode()))

    def picks(data: bytes) -> bool:
        head = data.split(b"\r\n\r\n", 1)[0].lower()
        return bool(line.match(data)) and all(h.lower().encode() in head for h in headers)

    return picks


def multipart_completion(data: bytes) -> bool:
    """Picks the request that completes a multipart upload (POST …?uploadId=…)."""
    line = data.split(b"\r\n", 1)[0]
    return data.startswith(b"POST ") and b"uploadId=" in line


def reply(status: int, reason: str, body: str = "", *, close: bool = False) -> bytes:
    """An HTTP/1.1 reply as a server would send it."""
    data = body.encode()
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(data)}\r\n"
    head += "Content-Type: application/xml\r\n"
    if close:
        head += "Connection: close\r\n"
    return (head + "\r\n").encode() + data


def s3_error(status: int, reason: str, code: str) -> bytes:
    """An S3 error reply of `code`."""
    body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code></Error>"
    return reply(status, reason, body)


@dataclass
class _Rule:
    picks: Picks
    times: int
    answer: bytes | None
    """None: forward, then cut at the reply; bytes: answer with them, forward nothing."""
    stall: bool = False
    """Forward, then hold the reply back for good (the connection stays open)."""


class HttpRelay(Relay):
    """A relay from a free loopback port to `upstream` (`http://host:port`)."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        super().__init__((parts.hostname or "127.0.0.1", parts.port or 80))
        self.picked = 0
        """Requests picked so far (cut or answered)."""
        self.requests: list[bytes] = []
        """The first chunk of every request seen, in order."""
        self._rules: list[_Rule] = []

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut_reply_to(self, picks: Picks, times: int = 1) -> None:
        """Forward the next `times` requests `picks` picks, and cut each one's connection at
        its reply: the server ran it, the client reads EOF."""
        with self._lock:
            self._rules.append(_Rule(picks, times, None))

    def answer(self, picks: Picks, answer: bytes, times: int = 1) -> None:
        """Answer the next `times` requests `picks` picks with `answer`, forwarding nothing."""
        with self._lock:
            self._rules.append(_Rule(picks, times, answer))

    def stall(self, picks: Picks, times: int = 1) -> None:
        """Forward the next `times` requests `picks` picks and never relay their replies,
        keeping the connections open: a server that hangs after taking a request."""
        with self._lock:
            self._rules.append(_Rule(picks, times, None, stall=True))

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def _rule_for(self, data: bytes) -> _Rule | None:
        with self._lock:
            if _starts_request(data):
                self.requests.append(data)
            for rule in self._rules:
                if rule.times > 0 and _starts_request(data) and rule.picks(data):
                    rule.times -= 1
                    self.picked += 1
                    return rule
        return None

    def pipe(self, client: socket.socket, server: socket.socket) -> None:
        cut, stalled = threading.Event(), threading.Event()
        threading.Thread(
            target=self._requests, args=(client, server, cut, stalled), daemon=True
        ).start()
        threading.Thread(
            target=self._replies, args=(server, client, cut, stalled), daemon=True
        ).start()

    def _requests(
        self,
        client: socket.socket,
        server: socket.socket,
        cut: threading.Event,
        stalled: threading.Event,
    ) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(1 << 20):
                rule = self._rule_for(data)
                if rule is not None and rule.answer is not None:
                    _drain_body(client, data)
                    client.sendall(rule.answer)
                    continue
                if rule is not None:
                    (stalled if rule.stall else cut).set()
                server.sendall(data)
        close_socket(server)

    def _replies(
        self,
        server: socket.socket,
        client: socket.socket,
        cut: threading.Event,
        stalled: threading.Event,
    ) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(1 << 20):
                if cut.is_set():
                    break
                if stalled.is_set():
                    continue
                client.sendall(data)
        if not stalled.is_set():
            close_socket(client)
        close_socket(server)


_METHODS = (b"GET ", b"PUT ", b"POST ", b"HEAD ", b"DELETE ")


def _starts_request(data: bytes) -> bool:
    return data.startswith(_METHODS)


def _drain_body(client: socket.socket, first: bytes) -> None:
    """Read the rest of an answered request's body (by its Content-Length), so the next
    request on the connection starts at a request line."""
    head, _, body = first.partition(b"\r\n\r\n")
    found = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    remaining = (int(found[1]) if found else 0) - len(body)
    while remaining > 0:
        chunk = client.recv(min(remaining, 1 << 20))
        if not chunk:
            return
        remaining -= len(chunk)


@contextlib.contextmanager
def relayed(upstream: str) -> Iterator[HttpRelay]:
    relay = HttpRelay(upstream)
    relay.start()
    try:
        yield relay
    finally:
        relay.stop()
