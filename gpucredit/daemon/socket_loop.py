"""The daemon's socket: one thread reads and answers every connection (selectors), no
thread per connection.

A hook is a one-shot process, so every hold and settle is a new connection. A thread per
connection (socketserver's threading server) cost each request a thread start and, under
load, dozens of threads taking turns at the GIL with the batch writer: about half of the
daemon's CPU went there. Here one thread accepts, reads lines, answers the quick requests
itself and hands holds and settles to the group commit; the writer hands each written
batch back (`call_soon`), and this thread words and sends its replies, waking once per
batch, not per request.

Replies on a connection keep the order of its requests: while one is being answered the
connection's further lines wait. A line longer than `max_line` is refused and the
connection closed (the rest of it is never read as requests); a line cut short by the
client's close is still answered, as a blocking readline would have; a connection idle
for `idle_seconds` is closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger("gpucredit.daemon")

# Called with a request line (bytes, without its newline) and the `Reply` to answer it
# through, from this loop's thread; the reply may come from any thread, later.
Dispatch = Callable[[bytes, "Reply"], None]


class Connection:
    __slots__ = ("buffer", "busy", "closing", "events", "last_seen", "outgoing", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.outgoing = b""
        self.busy = False  # a request of this connection is being answered: read no further
        self.closing = False  # hang up once what is owed is sent
        self.events = 0  # what the selector watches it for
        self.last_seen = time.monotonic()


class Reply:
    """The one answer owed to one request line: `send(encoded_line)` from any thread, once."""

    __slots__ = ("_connection", "_loop")

    def __init__(self, loop: SocketLoop, connection: Connection) -> None:
        self._loop = loop
        self._connection = connection

    def send(self, line: bytes) -> None:
        self._loop.answer(self._connection, line)


class SocketLoop:
    def __init__(
        self,
        listener: socket.socket,
        dispatch: Dispatch,
        *,
        max_line: int,
        too_long: bytes,
        idle_seconds: float = 30.0,
    ) -> None:
        self.listener = listener
        self.dispatch = dispatch
        self.max_line = max_line
        self.too_long = too_long
        self.idle_seconds = idle_seconds
        self._selector = selectors.DefaultSelector()
        self._connections: set[Connection] = set()
        self._answered: deque[tuple[Connection, bytes]] = deque()
        self._calls: deque[Callable[[], None]] = deque()
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._woken = False
        self._thread: threading.Thread | None = None  # the loop's, once it runs
        self._closed = False

    def answer(self, connection: Connection, line: bytes) -> None:
        """Queue `line` (ending in a newline) for `connection`; callable from any thread."""
        self._answered.append((connection, line))
        if threading.current_thread() is not self._thread:  # else drained before it next waits
            self._wake()

    def call_soon(self, call: Callable[[], None]) -> None:
        """Run `call` in this loop's thread, before it next waits; callable from any thread.
        The batch writer hands its batch's replies over this way: it goes on to the next
        batch while this thread words and sends them."""
        self._calls.append(call)
        if threading.current_thread() is not self._thread:
            self._wake()

    def _wake(self) -> None:
        if not self._woken and not self._closed:  # closed: its pipe's descriptors may be reused
            self._woken = True
            with contextlib.suppress(BlockingIOError):  # the pipe is full of wake-ups already
                os.write(self._wake_write, b"x")

    def run(self, stop: threading.Event, poll_seconds: float = 0.2) -> None:
        """Serve until `stop` is set (checked every `poll_seconds`); then close everything."""
        self._thread = threading.current_thread()
        self.listener.setblocking(False)
        self._selector.register(self.listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        next_sweep = time.monotonic() + 1.0
        try:
            while not stop.is_set():
                for key, events in self._selector.select(poll_seconds):
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wakeups()
                    elif events & selectors.EVENT_WRITE:
                        self._flush(key.data)
                    else:
                        self._read(key.data)
                self._send_answered()
                now = time.monotonic()
                if now >= next_sweep:
                    self._close_idle(now)
                    next_sweep = now + 1.0
        finally:
            for connection in list(self._connections):
                self._close(connection)
            self._selector.close()
            self._closed = True
            os.close(self._wake_read)
            os.close(self._wake_write)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # out of descriptors: the backlog waits for the next round
                log.warning("accepting a connection failed: %s", error)
                return
            sock.setblocking(False)
            connection = Connection(sock)
            self._connections.add(connection)
            self._watch(connection, selectors.EVENT_READ)
            # A hook connects and writes at once: its line is usually there already, and
            # reading it now saves a round of the selector.
            self._read(connection)

    def _watch(self, connection: Connection, events: int) -> None:
        if events == connection.events:
            return
        if not events:
            self._selector.unregister(connection.sock)
        elif not connection.events:
            self._selector.register(connection.sock, events, connection)
        else:
            self._selector.modify(connection.sock, events, connection)
        connection.events = events

    def _read(self, connection: Connection) -> None:
        try:
            data = connection.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        connection.last_seen = time.monotonic()
        if not data:
            # The client is done sending; a last line without its newline is still a request.
            connection.closing = True
            line, connection.buffer = connection.buffer, b""
            if line:
                self._handle(connection, line)
            else:
                self._close(connection)
            return
        connection.buffer += data
        self._next_lines(connection)

    def _next_lines(self, connection: Connection) -> None:
        """Dispatch the buffered lines in turn; one being answered holds back the rest."""
        while not connection.busy:
            end = connection.buffer.find(b"\n")
            if end < 0 and len(connection.buffer) <= self.max_line:
                return
            if end < 0 or end + 1 > self.max_line:
                # The rest of that line is no request: answer, then hang up.
                connection.buffer = b""
                connection.closing = True
                self._send(connection, self.too_long)
                return
            line, connection.buffer = connection.buffer[:end], connection.buffer[end + 1 :]
            self._handle(connection, line)

    def _handle(self, connection: Connection, line: bytes) -> None:
        connection.busy = True
        try:
            self.dispatch(line, Reply(self, connection))
        except Exception:  # a bug in one request must not stop the daemon's socket
            log.exception("dispatching a request failed")
            self._close(connection)
            return
        if not (self._answered and self._answered[-1][0] is connection):
            # Answered later (a hold, a settle): its next lines wait for that answer. One
            # answered here and now is sent before the selector is asked again.
            self._watch(connection, 0)

    def _drain_wakeups(self) -> None:
        # Empty the pipe first, then allow the next wake-up: the other way round, a writer
        # could find the flag down, write its byte into the pipe being emptied, raise the
        # flag, and the next answer would wait for the poll timeout (seen: 200 ms stalls).
        # Whatever was queued before this is sent after the round's events.
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_read, 4096):
                pass
        self._woken = False

    def _send_answered(self) -> None:
        while self._calls:
            call = self._calls.popleft()
            try:
                call()
            except Exception:  # one failed call must not stop the daemon's socket
                log.exception("a call handed to the socket loop failed")
        while self._answered:
            connection, line = self._answered.popleft()
            if connection in self._connections:  # else the client went away meanwhile
                connection.busy = False
                self._send(connection, line)

    def _send(self, connection: Connection, data: bytes) -> None:
        connection.outgoing += data
        self._flush(connection)

    def _flush(self, connection: Connection) -> None:
        try:
            sent = connection.sock.send(connection.outgoing)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:  # the client hung up: nothing more is owed to it
            self._close(connection)
            return
        connection.outgoing = connection.outgoing[sent:]
        if connection.outgoing:
            self._watch(connection, selectors.EVENT_WRITE)
        elif connection.closing:
            self._close(connection)
        else:
            connection.last_seen = time.monotonic()
            self._watch(connection, selectors.EVENT_READ)
            self._next_lines(connection)

    def _close_idle(self, now: float) -> None:
        for connection in list(self._connections):
            if not connection.busy and now - connection.last_seen > self.idle_seconds:
                self._close(connection)

    def _close(self, connection: Connection) -> None:
        if connection not in self._connections:
            return
        self._connections.discard(connection)
        self._watch(connection, 0)
        connection.sock.close()
