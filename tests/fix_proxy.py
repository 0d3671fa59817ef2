"""A TCP proxy between a client and a server, to cut the network on purpose.

``freeze()`` stops forwarding in both directions but keeps every connection open: what each
side sends waits in the proxy's socket buffers, as on a network that silently drops packets
(no reset, no FIN). ``drop()`` closes every connection at once, as a reset would, and
``restore()`` forwards again. New connections are accepted in every state; while frozen they
carry nothing. The ``tcp_proxy`` fixture makes one per test and stops it (and its threads)
at the end. It listens on 127.0.0.1, or on another loopback address (``listen_host``): a
server reached through it on 127.0.0.2 is a host its TLS certificate does not name.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

_CHUNK = 65_536


class TcpProxy:
    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server((listen_host, listen_port))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._frozen = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._acceptor.start()

    def freeze(self) -> None:
        self._frozen.set()

    def restore(self) -> None:
        self._frozen.clear()

    def drop(self) -> None:
        """Close every open connection (both ends see them end); new ones are accepted."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for end in pair:
                _close(end)

    def stop(self) -> None:
        self._stopping.set()
        self.drop()
        self._acceptor.join(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self._target, timeout=5)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._pairs.append((client, server))
            thread = threading.Thread(
                target=self._pump, args=(client, server), name="tcp-proxy-pump", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peer = {client: server, server: client}
        with selectors.DefaultSelector() as selector:
            try:
                selector.register(client, selectors.EVENT_READ)
                selector.register(server, selectors.EVENT_READ)
            except (OSError, ValueError):
                return  # dropped before the first byte
            while not self._stopping.is_set():
                if self._frozen.is_set():
                    self._stopping.wait(0.05)  # read nothing: the data waits, unanswered
                    if client.fileno() < 0 or server.fileno() < 0:
                        return
                    continue
                try:
                    ready = selector.select(timeout=0.1)
                    for key, _ in ready:
                        source: socket.socket = key.fileobj  # type: ignore[assignment]
                        data = source.recv(_CHUNK)
                        if not data:
                            raise ConnectionResetError
                        peer[source].sendall(data)
                except (OSError, ValueError):
                    _close(client)
                    _close(server)
                    return


def _close(end: socket.socket) -> None:
    with contextlib.suppress(OSError):
        end.shutdown(socket.SHUT_RDWR)
    end.close()


@pytest.fixture
def tcp_proxy() -> Iterator[Callable[..., TcpProxy]]:
    """``tcp_proxy(host, port, listen_host=..., listen_port=...)``: a proxy to that server
    (on a free port unless ``listen_port`` is given), stopped at the end of the test."""
    proxies: list[TcpProxy] = []

    def make(
        host: str, port: int, *, listen_host: str = "127.0.0.1", listen_port: int = 0
    ) -> TcpProxy:
        proxy = TcpProxy(host, port, listen_host=listen_host, listen_port=listen_port)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.stop()
