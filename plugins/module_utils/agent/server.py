# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The agent's HTTP endpoints: ``/metrics`` for Prometheus, ``/healthz`` and ``/health`` for probes, behind
TLS and basic authentication when a web configuration file asks for them (``agent.web_config``) (private)."""

from __future__ import annotations

import collections
import json
import logging
import select
import selectors
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ansible_collections.scv.gpu.plugins.module_utils.agent.metrics import exposition
from ansible_collections.scv.gpu.plugins.module_utils.agent.web_config import WebConfig
from ansible_collections.scv.gpu.plugins.module_utils.agent.web_access import Authenticator, HandshakeLog, accept_tls

LOG = logging.getLogger("scv-gpu-agent")


# Connections served at once: Prometheus, a probe and an operator's curl need a few. A connection takes
# one of these only once its request has begun to arrive; until then it waits in the WaitingRoom.
MAX_CONNECTIONS = 8
# Connections that have asked nothing yet: each costs a file descriptor and no thread. Past this many,
# the one that has waited longest is closed; any is closed after IDLE_S.
MAX_WAITING = 256
IDLE_S = 10.0


IDLE_POLL_S = 60.0
NO_WEB_CONFIG = WebConfig(None)   # plain HTTP to anyone


class WaitingRoom(threading.Thread):
    """Accepted connections that have not sent a byte yet, watched by one thread: an idle or half-open
    connection holds no slot, so a crowd of them cannot keep a scrape waiting for one."""

    def __init__(self, dispatch, close, idle_s=IDLE_S, most=MAX_WAITING):
        super().__init__(name="http-waiting", daemon=True)
        self._dispatch, self._close = dispatch, close
        self.idle_s, self.most = idle_s, most
        self._selector = selectors.DefaultSelector()
        self._arrivals = collections.deque()
        self._waiting = {}          # socket: (address, deadline), oldest first
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ)

    def add(self, request, address):
        """From the accepting thread: ``request`` waits here until it is readable."""
        self._arrivals.append((request, address))
        try:
            self._wake_write.send(b"\0")
        except BlockingIOError:
            pass                     # a wake-up is already pending

    def waiting(self):
        return len(self._waiting)

    def run(self):
        while True:
            deadlines = [deadline for _address, deadline in self._waiting.values()]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            for key, _events in self._selector.select(timeout):
                if key.fileobj is self._wake_read:
                    while True:
                        try:
                            if not self._wake_read.recv(4096):
                                break
                        except BlockingIOError:
                            break
                    continue
                self._selector.unregister(key.fileobj)
                address, _deadline = self._waiting.pop(key.fileobj)
                try:
                    self._dispatch(key.fileobj, address)   # waits for a free slot
                except Exception:  # pylint: disable=broad-exception-caught
                    self._close(key.fileobj)               # no thread to serve it: this one goes, the room stays
            self._admit()
            now = time.monotonic()
            for request in [request for request, (_a, deadline) in self._waiting.items() if deadline <= now]:
                self._drop(request)

    def _admit(self):
        while self._arrivals:
            request, address = self._arrivals.popleft()
            self._waiting[request] = (address, time.monotonic() + self.idle_s)
            self._selector.register(request, selectors.EVENT_READ)
            if len(self._waiting) > self.most:
                self._drop(next(iter(self._waiting)))

    def _drop(self, request):
        self._selector.unregister(request)
        del self._waiting[request]
        self._close(request)


class BoundedServer(ThreadingHTTPServer):
    """A threading HTTP server that serves at most ``MAX_CONNECTIONS`` requests at once, and gives a thread
    only to a connection whose request has begun to arrive (see ``WaitingRoom``)."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address, handler, web=None):
        super().__init__(address, handler)
        self.web = web                     # a web_config.WebConfig (None: plain HTTP to anyone); SIGHUP replaces it
        self.auth = Authenticator()
        self.handshakes = HandshakeLog()
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.room = WaitingRoom(self._serve, self.shutdown_request)
        self.room.start()

    def process_request(self, request, client_address):
        self.room.add(request, client_address)     # the accepting thread never waits

    def handle_error(self, request, client_address):
        """A peer that breaks off its connection (a reset, a bad TLS record, silence past the timeout) is a line
        at debug level, never a traceback, which socketserver would print for each; anything else is the
        agent's own failure, logged with its traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, ssl.SSLError, TimeoutError)):
            LOG.debug("the connection from %s ended: %s", client_address[0], error)
            return
        LOG.exception("serving a request from %s failed", client_address[0])

    def _serve(self, request, client_address):
        self.slots.acquire()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def finish_request(self, request, client_address):
        if isinstance(request, ssl.SSLSocket):
            # back from the waiting room after its handshake: its request has begun to arrive
            try:
                super().finish_request(request, client_address)
            finally:
                request.close()
            return
        web = self.web          # a connection keeps the configuration it began with
        if web is None or web.tls is None:
            super().finish_request(request, client_address)
            return
        secured = accept_tls(request, client_address, web.tls, IDLE_S, self.handshakes)
        if secured is None:
            return
        if not secured.pending() and not _readable(secured):
            # Handshaken, and nothing asked yet: the connection waits without a slot, as before its handshake, so
            # that connections sitting idle after their handshake cannot keep a scrape waiting.
            self.room.add(secured, client_address)
            return
        try:
            super().finish_request(secured, client_address)
        finally:
            secured.close()


def _readable(sock):
    """Whether ``sock`` has bytes to read now (without waiting); poll, as select takes no descriptor past 1023."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class BoundedServer6(BoundedServer):
    """The same on an IPv6 address (``--metrics-address [::1]:9400``)."""

    address_family = socket.AF_INET6


def serve(agent, host, port, web=None):
    """Serves ``agent``'s metrics and health on ``host:port`` in a daemon thread, as the web_config.WebConfig
    ``web`` says (None: plain HTTP to anyone); returns the server.

    OSError when the address cannot be bound.
    """

    class Handler(BaseHTTPRequestHandler):
        timeout = IDLE_S   # seconds a request may take to arrive once begun: each holds a thread

        def do_GET(self):  # noqa: N802 (the http.server API)
            if not self.server.auth.allows(self.server.web or NO_WEB_CONFIG, self.headers.get("Authorization")):
                self._answer(401, b"Unauthorized\n", "text/plain; charset=utf-8", {"WWW-Authenticate": "Basic"})
                return
            path = self.path.split("?")[0]
            if path == "/metrics":
                agent.readings.scrape()
                self._answer(200, exposition(agent.snapshot), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/healthz":
                healthy, detail = agent.healthz()
                body = json.dumps({"status": "ok" if healthy else "failing", "detail": detail}).encode()
                self._answer(200 if healthy else 503, body, "application/json")
            elif path == "/health":   # dcgm-exporter's: "OK", here with /healthz's verdict
                healthy, detail = agent.healthz()
                self._answer(200 if healthy else 503, b"OK" if healthy else ("failing: %s" % detail).encode(),
                             "text/plain; charset=utf-8", {"X-Content-Type-Options": "nosniff"})
            else:
                self.send_error(404)

        def end_headers(self):
            for name, value in (self.server.web or NO_WEB_CONFIG).headers.items():
                self.send_header(name, value)
            super().end_headers()

        def _answer(self, status, body, content_type, headers=None):
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):
            pass

    server = (BoundedServer6 if ":" in host else BoundedServer)((host, port), Handler, web)
    # The poll interval bounds only how soon shutdown() is heard, and nothing calls it (a daemon thread):
    # at the default 0.5 s the idle server woke twice a second, 0.016 % of a core.
    threading.Thread(target=server.serve_forever, args=(IDLE_POLL_S,), name="http", daemon=True).start()
    return server
