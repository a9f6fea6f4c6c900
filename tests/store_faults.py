"""A proxy in front of the S3 server that injects the faults object storage has: a store that answers 503
for a while, an endpoint that is gone (the proxy stops listening, as a restarting server), a commit whose
response is lost after the write landed (the log entry is stored, the client hears nothing), alone or
followed by the endpoint going away (a store restarting between writing and answering), and a commit whose
connection is reset before anything was stored (a store restarting mid-request: what a client's pooled
connection meets when the endpoint goes away).

It runs as a process of its own on 127.0.0.1 (delta-rs holds the GIL in some calls, so a proxy thread in
the test process would wait for the very request it should answer), started by the test and stopped by
PID. The table's `AWS_ENDPOINT_URL` points at it, so the Spark tasks, the driver's delta-rs and the oracle
all go through it. It forwards each request unchanged (headers and body bytes, whatever their encoding)
and counts what it saw, so a test can show a fault was really met. The test steers it through requests
to `/__faults__/...` on the same port (`StoreProxy`).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# A Delta commit: the put of the next log entry (`_delta_log/00000000000000000042.json`).
CONTROL = "/__faults__/"
LOG_ENTRY = re.compile(r"/_delta_log/\d{20}\.json(\?|$)")
SLOW_DOWN = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


class ProxyServer:
    """Forward to `upstream_port`; `refuse_for`, `lose_next_commit_response`, `away_for` inject faults."""

    def __init__(self, upstream_port: int, port: int = 0):
        self.upstream_port = upstream_port
        self.seen: Counter = Counter()  # requests, refused, commits, lost commit responses
        self._refuse_until = self._refuse_commits_until = 0.0
        self._lose_commits = self._reset_commits = 0
        self._away_after_lost = 0.0
        self._lock = threading.Lock()
        # Listening or not is changed by one thread at a time: a lost commit's handler and a control request
        # may both send the endpoint away, and a server is stopped (and started again) once.
        self._serving = threading.Lock()
        self._away_until = 0.0
        self._server: ThreadingHTTPServer | None = None
        self.port = port
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Listen (again, on the same port after a stop: the endpoint comes back). Listening already: nothing."""
        with self._serving:
            self._listen()

    def _listen(self) -> None:  # with self._serving held
        if self._server is not None:
            return
        handler = type("Handler", (_Forward,), {"proxy": self})
        self._server = _QuietServer(("127.0.0.1", self.port), handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True, name="store-proxy").start()

    def stop(self) -> None:
        """Stop listening: connections are refused until `start`. Stopped already: nothing."""
        with self._serving:
            server, self._server = self._server, None
            if server is not None:
                server.shutdown()
                server.server_close()

    def away_for(self, seconds: float) -> None:
        """The endpoint is gone for `seconds` (connections refused), then back on the same port: a store
        restarting, seen from its clients. Sent away while away, it comes back at the later of the two ends."""
        with self._serving:
            already_away = self._away_until > 0
            self._away_until = max(self._away_until, time.monotonic() + seconds)
        self.seen["away"] += 1
        if already_away:
            return
        self.stop()
        threading.Thread(target=self._come_back, daemon=True, name="store-proxy-away").start()

    def _come_back(self) -> None:
        while True:
            with self._serving:
                left = self._away_until - time.monotonic()
                if left <= 0:  # back, unless sent away again meanwhile (the same lock decides)
                    self._away_until = 0.0
                    self._listen()
                    return
            time.sleep(min(left, 0.1))

    def control(self, path: str) -> dict:
        """`/__faults__/<verb>?seconds=N&count=N` from the test."""
        verb, _, query = path[len(CONTROL) :].partition("?")
        args = {k: float(v[0]) for k, v in urllib.parse.parse_qs(query).items()}
        if verb == "refuse":
            self.refuse_for(args["seconds"])
        elif verb == "refuse_commits":
            self.refuse_commits_for(args["seconds"])
        elif verb == "lose_commit_response":
            self.lose_next_commit_response(int(args.get("count", 1)), args.get("away", 0.0))
        elif verb == "reset_commit":
            self.reset_next_commit(int(args.get("count", 1)))
        elif verb == "away":
            self.away_for(args["seconds"])
        return dict(self.seen)

    def refuse_for(self, seconds: float) -> None:
        """Every request answered 503 SlowDown (S3's "reduce your request rate") for `seconds`."""
        with self._lock:
            self._refuse_until = time.monotonic() + seconds

    def refuse_commits_for(self, seconds: float) -> None:
        """Only the puts of log entries answered 503 for `seconds`: the data files are written, the commit
        cannot land."""
        with self._lock:
            self._refuse_commits_until = time.monotonic() + seconds

    def lose_next_commit_response(self, count: int = 1, away: float = 0.0) -> None:
        """The next `count` puts of a log entry are stored upstream, and then the client's connection is
        closed without an answer: the writer cannot know its commit landed. With `away`, the endpoint is
        then gone for that many seconds: a store that restarted after writing and before answering."""
        with self._lock:
            self._lose_commits += count
            self._away_after_lost = away

    def reset_next_commit(self, count: int = 1) -> None:
        """The next `count` puts of a log entry are not forwarded: their connection is reset (TCP RST). Nothing
        was stored; the writer hears "connection reset by peer", which the object-store client does not retry
        for a put (it cannot know the put did not land)."""
        with self._lock:
            self._reset_commits += count

    def _decide(self, method: str, path: str) -> str:
        with self._lock:
            self.seen["requests"] += 1
            if time.monotonic() < self._refuse_until:
                self.seen["refused"] += 1
                return "refuse"
            if method == "PUT" and LOG_ENTRY.search(path):
                self.seen["commits"] += 1
                if time.monotonic() < self._refuse_commits_until:
                    self.seen["refused commits"] += 1
                    return "refuse"
                if self._reset_commits:
                    self._reset_commits -= 1
                    self.seen["reset commits"] += 1
                    return "reset"
                if self._lose_commits:
                    self._lose_commits -= 1
                    self.seen["lost commit responses"] += 1
                    return "lose"
            return "forward"


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A client that closed its connection before sending a request (a retry, a killed job) is not news."""
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


class _Forward(BaseHTTPRequestHandler):
    proxy: ProxyServer
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle's algorithm the second waits for the client's
    # delayed ACK of the first: 45 ms on every request (measured: 48 ms per GET through the proxy, 3 direct).
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:  # quiet: the counts say what happened
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                line = self.rfile.readline()
                if not line:  # the client hung up mid-body (a killed job): as a reset connection
                    raise ConnectionResetError("the client closed its connection inside a chunked body")
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if len(body) < length:
            raise ConnectionResetError("the client closed its connection inside its body")
        return body

    def _handle(self) -> None:
        try:
            self._serve()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up on this request: its retry comes anew

    def _serve(self) -> None:
        body = self._body()
        if self.path.startswith(CONTROL):
            self._answer(200, json.dumps(self.proxy.control(self.path)).encode())
            return
        action = self.proxy._decide(self.command, self.path)
        if action == "refuse":
            self._answer(503, SLOW_DOWN)
            return
        if action == "reset":  # closed with a zero linger: the kernel sends RST, not FIN
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            return
        status, headers, answer = self._upstream(body)
        if action == "lose":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)  # the write landed; the writer hears nothing
            if self.proxy._away_after_lost:
                self.proxy.away_for(self.proxy._away_after_lost)
            return
        self.send_response(status)
        for key, value in headers:
            if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                self.send_header(key, value)
        length = dict((k.lower(), v) for k, v in headers).get("content-length", "0")
        self.send_header("Content-Length", length if self.command == "HEAD" else str(len(answer)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer)

    def _upstream(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.proxy.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body or None, headers=headers)
            response = conn.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            conn.close()

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


CONTROL_PATIENCE = 30.0  # seconds: longer than any away window a fault sets (at most 4)


class StoreProxy:
    """The test's handle on a proxy process in front of the S3 server on `upstream_port`."""

    def __init__(self, upstream_port: int):
        from hosts import free_port, wait_for

        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__)), str(upstream_port), str(self.port)],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for(self._answers, "the object-store fault proxy", 30, self.proc, None)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}{CONTROL}seen", timeout=10):
                return True
        except OSError:
            return False

    def _control(self, verb: str, **args: float) -> Counter:
        """One control request. The endpoint may be away (a fault another lane's commit set off, up to a few
        seconds): asked again until CONTROL_PATIENCE passes, as a store's client would."""
        query = urllib.parse.urlencode(args)
        deadline = time.monotonic() + CONTROL_PATIENCE
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}{CONTROL}{verb}?{query}", timeout=10) as answer:
                    return Counter(json.loads(answer.read()))
            except OSError:  # URLError is one: connection refused while away
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.2)

    @property
    def seen(self) -> Counter:
        return self._control("seen")

    def refuse_for(self, seconds: float) -> None:
        self._control("refuse", seconds=seconds)

    def refuse_commits_for(self, seconds: float) -> None:
        self._control("refuse_commits", seconds=seconds)

    def lose_next_commit_response(self, count: int = 1, away: float = 0.0) -> None:
        self._control("lose_commit_response", count=count, away=away)

    def reset_next_commit(self, count: int = 1) -> None:
        self._control("reset_commit", count=count)

    def away_for(self, seconds: float) -> None:
        self._control("away", seconds=seconds)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _die_of(args) -> None:
    """A proxy thread that dies takes the proxy with it: the test sees the process gone, and says so."""
    sys.__excepthook__(args.exc_type, args.exc_value, args.exc_traceback)
    print(f"store fault proxy: thread {args.thread.name if args.thread else '?'} died; exiting", file=sys.stderr)
    sys.stderr.flush()
    os._exit(70)


if __name__ == "__main__":
    threading.excepthook = _die_of
    ProxyServer(int(sys.argv[1]), int(sys.argv[2]))
    threading.Event().wait()
