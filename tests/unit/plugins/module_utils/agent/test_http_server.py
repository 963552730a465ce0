"""The agent's HTTP server under a crowd: connections that ask nothing hold no thread and no slot."""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent import server
from harness.common import wait_until


class Answer(BaseHTTPRequestHandler):
    timeout = 2

    def do_GET(self):  # noqa: N802 (the http.server API)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *_args):
        pass


@pytest.fixture
def serving():
    bound = server.BoundedServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=bound.serve_forever, args=(0.1,), daemon=True).start()
    yield bound
    bound.shutdown()
    bound.server_close()


def get(bound):
    with urllib.request.urlopen("http://127.0.0.1:%d/" % bound.server_address[1], timeout=5) as response:
        return response.read()


def test_a_crowd_of_idle_connections_neither_takes_threads_nor_delays_a_request(serving):
    threads = threading.active_count()
    idle = [socket.create_connection(serving.server_address, timeout=5) for _connection in range(100)]
    try:
        wait_until(lambda: serving.room.waiting() == 100, 5, "the waiting room")
        assert threading.active_count() == threads
        started = time.monotonic()
        assert get(serving) == b"ok" and time.monotonic() - started < 1
    finally:
        for connection in idle:
            connection.close()


def test_past_the_most_the_longest_waiting_is_closed_and_any_after_the_idle_time(serving):
    serving.room.most, serving.room.idle_s = 3, 0.5
    first = socket.create_connection(serving.server_address, timeout=5)
    later = [socket.create_connection(serving.server_address, timeout=5) for _connection in range(3)]
    try:
        assert first.recv(1) == b""                              # closed to make room
        wait_until(lambda: serving.room.waiting() == 3, 5, "the waiting room")
        for connection in later:
            assert connection.recv(1) == b""                     # closed after 0.5 s of nothing
        assert serving.room.waiting() == 0 and get(serving) == b"ok"
    finally:
        for connection in [first] + later:
            connection.close()


def test_a_request_that_begins_takes_a_slot_and_ends_with_its_answer(serving):
    connection = socket.create_connection(serving.server_address, timeout=5)
    try:
        connection.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert connection.recv(4096).startswith(b"HTTP/1.0 200")
    finally:
        connection.close()
    assert serving.slots.acquire(timeout=5)                      # every slot given back
    serving.slots.release()


@pytest.fixture
def serving_tls(tmp_path):
    """The server with TLS on, from a web configuration file as the agent loads it."""
    from ansible_collections.scv.gpu.plugins.module_utils.agent.web_config import load
    from harness.tls_certs import TestPki
    pki = TestPki(tmp_path / "pki")
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: %s\n  key_file: %s\n" % pki.server)
    bound = server.BoundedServer(("127.0.0.1", 0), Answer, load(str(web)))
    threading.Thread(target=bound.serve_forever, args=(0.1,), daemon=True).start()
    client = ssl.create_default_context(cafile=str(pki.ca))
    client.check_hostname = False
    yield bound, client
    bound.shutdown()
    bound.server_close()


def test_connections_idle_after_their_handshake_wait_without_a_slot_and_never_delay_a_scrape(serving_tls):
    """Each of 20 clients finishes its TLS handshake, then asks nothing: they go back to the waiting room, so a
    scrape beside them is answered at once (each held one of the 8 slots until its 10 s timeout before)."""
    bound, client = serving_tls
    idle = []
    try:
        for _connection in range(20):
            raw = socket.create_connection(bound.server_address, timeout=5)
            idle.append(client.wrap_socket(raw))          # the handshake completes here
        wait_until(lambda: bound.room.waiting() == 20, 5, "the handshaken connections in the waiting room")
        started = time.monotonic()
        with client.wrap_socket(socket.create_connection(bound.server_address, timeout=5)) as scrape:
            scrape.sendall(b"GET / HTTP/1.0\r\n\r\n")
            assert scrape.recv(4096).startswith(b"HTTP/1.0 200")
        assert time.monotonic() - started < 1
        # an idle one that asks later is served in its turn
        idle[0].sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert idle[0].recv(4096).startswith(b"HTTP/1.0 200")
    finally:
        for connection in idle:
            connection.close()


def test_a_peer_that_resets_its_connection_is_a_debug_line_not_a_traceback(serving_tls, capfd, caplog):
    """socketserver prints a traceback for every request that raises; a peer's reset is the peer's affair."""
    caplog.set_level("DEBUG", logger="scv-gpu-agent")
    bound, client = serving_tls
    reading = threading.Semaphore(0)

    class Reading(Answer):
        def setup(self):
            super().setup()
            reading.release()                           # next: the request line is read

    bound.RequestHandlerClass = Reading
    for _attempt in range(3):
        connection = client.wrap_socket(socket.create_connection(bound.server_address, timeout=5))
        connection.sendall(b"GET / HT")                 # a request begun: the server reads it in a thread
        assert reading.acquire(timeout=5)
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        connection.close()                              # then a reset
    wait_until(lambda: len([record for record in caplog.records if "ended" in record.getMessage()]) == 3, 5,
               "three debug lines")
    assert "Traceback" not in capfd.readouterr().err
    assert all(record.levelname == "DEBUG" and record.getMessage().startswith("the connection from 127.0.0.1 ended: ")
               for record in caplog.records if "ended" in record.getMessage())


def test_the_agents_own_failure_while_serving_keeps_its_traceback(serving, caplog):
    class Broken(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the http.server API)
            raise KeyError("a bug of ours")

    serving.RequestHandlerClass = Broken
    with socket.create_connection(serving.server_address, timeout=5) as connection:
        connection.sendall(b"GET / HTTP/1.0\r\n\r\n")
        connection.recv(10)
    wait_until(lambda: any(record.exc_info for record in caplog.records), 5, "the logged failure")
    (failed,) = [record for record in caplog.records if record.exc_info]
    assert failed.levelname == "ERROR" and failed.getMessage() == "serving a request from 127.0.0.1 failed"
