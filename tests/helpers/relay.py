"""A TCP relay on a loopback port in front of a real server (PostgreSQL, SeaweedFS): what a
network between them would do on cue (lose a reply, stall, go down and come back) without
touching the server other tests share."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.helpers.servers import free_port


class Relay:
    """Pairs each connection accepted on `port` with one to `target`; `pipe` moves their
    bytes (a plain copy both ways here; subclasses lose or answer what they pick). `stop`
    closes the listener and every relayed connection, both ends; `start` listens again on
    the same port, as a restarted server would."""

    def __init__(self, target: tuple[str, int], port: int | None = None) -> None:
        self.target = target
        self.port = free_port() if port is None else port
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
            self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            close_socket(sock)

    def pipe(self, client: socket.socket, server: socket.socket) -> None:
        """Start moving the bytes of one relayed connection."""
        for source, sink in ((client, server), (server, client)):
            threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                close_socket(client)
                continue
            with self._lock:
                self._sockets += [client, server]
            self.pipe(client, server)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes one way until either end closes, then close the other way too."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def close_socket(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
