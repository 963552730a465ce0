"""What protecting the agent's endpoint costs: basic authentication and TLS, timed in-process as CPU of this process.

- one password check by bcrypt (the first scrape after a start or a changed password), at cost 10;
- the same check answered from the cache (every later scrape);
- a whole request to the agent's own server for /health: plain HTTP, and TLS with a verified client
  certificate and basic authentication (a new connection, so a full handshake, each time: the agent
  answers HTTP/1.0 and closes). The client's CPU is in the figure too, so it bounds the agent's from above.

    PYTHONPATH=tests:build/collections .venv/bin/python benchmarks/web_auth.py
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import platform
import ssl
import tempfile
import time

import bcrypt

from ansible_collections.scv.gpu.plugins.module_utils.agent import server, web_config
from ansible_collections.scv.gpu.plugins.module_utils.agent.loop import Agent
from ansible_collections.scv.gpu.plugins.module_utils.agent.web_access import Authenticator
from ansible_collections.scv.gpu.plugins.module_utils.nvml.session import Session
from harness.agent_samples import QuietClient
from harness.tls_certs import TestPki


def cpu_ms(function, runs):
    started = time.process_time()
    for _run in range(runs):
        function()
    return 1000.0 * (time.process_time() - started) / runs


def main():
    parsed = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parsed.add_argument("--runs", type=int, default=50)
    runs = parsed.parse_args().runs
    work = tempfile.mkdtemp()
    pki = TestPki(work + "/pki")
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(10)).decode()
    path = work + "/web.yml"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("tls_server_config:\n  cert_file: %s\n  key_file: %s\n  client_ca_file: %s\n"
                     "  client_auth_type: RequireAndVerifyClientCert\nbasic_auth_users:\n  prometheus: '%s'\n"
                     % (pki.server[0], pki.server[1], pki.ca, hashed))
    web = web_config.load(path)
    header = "Basic " + base64.b64encode(b"prometheus:pw").decode()
    fresh = cpu_ms(lambda: Authenticator().allows(web, header), max(3, runs // 10))
    cached_auth = Authenticator()
    cached = cpu_ms(lambda: cached_auth.allows(web, header), runs * 100)

    agent = Agent(QuietClient(), "bench", Session(),
                  node_condition=False)
    plain_server, tls_server = server.serve(agent, "127.0.0.1", 0), server.serve(agent, "127.0.0.1", 0, web)
    client = ssl.create_default_context(cafile=str(pki.ca))
    client.load_cert_chain(str(pki.client[0]), str(pki.client[1]))

    def request(bound, context=None):
        kind = http.client.HTTPSConnection if context else http.client.HTTPConnection
        connection = kind("127.0.0.1", bound.server_address[1], timeout=5, **({"context": context} if context else {}))
        connection.request("GET", "/health", headers={"Authorization": header})
        assert connection.getresponse().read() == b"OK"
        connection.close()

    request(tls_server, client)   # the password's first check
    print(json.dumps({
        "machine": platform.processor() or platform.machine(), "python": platform.python_version(),
        "bcrypt_check_cost_10_ms": round(fresh, 2), "cached_check_ms": round(cached, 4),
        "plain_http_request_ms": round(cpu_ms(lambda: request(plain_server), runs), 2),
        "tls_client_cert_basic_auth_request_ms": round(cpu_ms(lambda: request(tls_server, client), runs), 2),
    }, indent=2))


if __name__ == "__main__":
    main()
