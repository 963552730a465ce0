"""A Kubernetes API server that accepts connections and never answers, and a kubeconfig that points at it."""

from __future__ import annotations

import json
import socket
import threading


class StalledServer:
    """Accepts TCP connections on 127.0.0.1 and never sends a byte."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held = []
        self.accepted = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _address = self.sock.accept()
            except OSError:
                return
            self.held.append(connection)
            self.accepted.set()

    def close(self):
        for connection in self.held:
            connection.close()
        self.sock.close()


def stalled_kubeconfig(plane, server, path):
    """The admin kubeconfig of ``plane``, its server replaced by ``server``; written to ``path``."""
    config = json.loads(plane.admin_kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:%d" % server.port
    path.write_text(json.dumps(config))
    return path
