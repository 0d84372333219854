"""A raw TCP listener on a loopback port that counts who dials it: stands for an internal service
(a database, an SSH daemon) the page must not be made to probe."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class TcpListener:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.accepted = 0

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])


@contextmanager
def tcp_listener(*, greeting: bytes | None = None, hold_s: float = 40.0) -> Iterator[TcpListener]:
    """``greeting``: sent on accept, then the connection is closed (a service that is not the
    expected database). ``None``: say nothing and hold the connection ``hold_s`` (a silent service)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.1)
    listener = TcpListener(sock)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            listener.accepted += 1
            if greeting is not None:
                try:
                    conn.sendall(greeting)
                finally:
                    conn.close()
            else:
                held.append(conn)
                timer = threading.Timer(hold_s, conn.close)
                timer.daemon = True
                timer.start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.close()
        for conn in held:
            conn.close()


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
