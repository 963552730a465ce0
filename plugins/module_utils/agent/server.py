# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The agent's HTTP endpoints: ``/metrics`` for Prometheus and ``/healthz`` for probes (private)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ansible_collections.scv.gpu.plugins.module_utils.agent.metrics import exposition


def serve(agent, host, port):
    """Serves ``agent``'s metrics and health on ``host:port`` in a daemon thread; returns the server."""

    class Handler(BaseHTTPRequestHandler):
        timeout = 10   # seconds a connection may sit idle: each holds a thread

        def do_GET(self):  # noqa: N802 (the http.server API)
            path = self.path.split("?")[0]
            if path == "/metrics":
                agent.readings.scrape()
                self._answer(200, exposition(agent.snapshot), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/healthz":
                healthy, detail = agent.health()
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

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
