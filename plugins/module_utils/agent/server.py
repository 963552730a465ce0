# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The agent's HTTP endpoints: ``/metrics`` for Prometheus and ``/healthz`` for probes (private)."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ansible_collections.scv.gpu.plugins.module_utils.agent.metrics import exposition, load


# Connections served at once: Prometheus, a probe and an operator's curl need a few; more wait in the
# listen queue (and those past it are refused by the kernel) instead of each holding a thread.
MAX_CONNECTIONS = 8


IDLE_POLL_S = 60.0


class BoundedServer(ThreadingHTTPServer):
    """A threading HTTP server that serves at most ``MAX_CONNECTIONS`` connections at once."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address, handler):
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request, client_address):
        self.slots.acquire()     # the accepting thread waits for a slot: the next connection waits in the queue
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


class BoundedServer6(BoundedServer):
    """The same on an IPv6 address (``--metrics-address [::1]:9400``)."""

    address_family = socket.AF_INET6


def serve(agent, host, port):
    """Serves ``agent``'s metrics and health on ``host:port`` in a daemon thread; returns the server.

    OSError when the address cannot be bound; ImportError when prometheus_client is missing.
    """
    load()

    class Handler(BaseHTTPRequestHandler):
        timeout = 10   # seconds a connection may sit idle: each holds a thread

        def do_GET(self):  # noqa: N802 (the http.server API)
            path = self.path.split("?")[0]
            if path == "/metrics":
                agent.readings.scrape()
                self._answer(200, exposition(agent.snapshot), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/healthz":
                healthy, detail = agent.healthz()
                body = json.dumps({"status": "ok" if healthy else "failing", "detail": detail}).encode()
                self._answer(200 if healthy else 503, body, "application/json")
            else:
                self.send_error(404)

        def _answer(self, status, body, content_type):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):
            pass

    server = (BoundedServer6 if ":" in host else BoundedServer)((host, port), Handler)
    # The poll interval bounds only how soon shutdown() is heard, and nothing calls it (a daemon thread):
    # at the default 0.5 s the idle server woke twice a second, 0.016 % of a core.
    threading.Thread(target=server.serve_forever, args=(IDLE_POLL_S,), name="http", daemon=True).start()
    return server
