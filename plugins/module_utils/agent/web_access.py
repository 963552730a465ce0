# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Who may read the agent's HTTP endpoint, as a ``web_config.WebConfig`` says: the TLS handshake of each
connection and the basic authentication of each request (private)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import socket
import ssl
import threading
import time

LOG = logging.getLogger("scv-gpu-agent")
# Checks remembered, successes and failures apart (as exporter-toolkit, which keeps 100): a crowd of wrong
# passwords pushes out only other wrong passwords, never the scraper's.
CACHE_SIZE = 100
# What a client that speaks plain HTTP to the TLS port is told (a TLS handshake record begins with 0x16).
PLAIN_HTTP_ANSWER = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
                     b"This endpoint serves HTTPS only: scrape it with the https scheme.\n")
TLS_HANDSHAKE = 0x16
LOG_EVERY_S = 60.0


class Authenticator:
    """Checks ``Authorization: Basic`` against a WebConfig's users; bcrypt runs only for a (user, hash,
    password) not seen before, one check at a time.

    A check costs 50 to 250 ms of CPU by design: a scrape every 30 s would cost up to 0.8 % of a core. The
    cache's keys are an HMAC, under a key made at start, of the user, the stored hash and the password:
    a changed hash or password never meets an old answer, no password is kept in memory, and a lookup
    compares digests an attacker cannot choose.
    """

    def __init__(self, size=CACHE_SIZE):
        self.size = size
        self.bcrypt_checks = 0
        self._secret = os.urandom(32)
        self._answers = {True: {}, False: {}}
        self._lock = threading.Lock()
        self._bcrypt_lock = threading.Lock()

    def _key(self, user, hashed, password):
        mac = hmac.new(self._secret, digestmod=hashlib.sha256)
        for part in (user, hashed, password):
            mac.update(len(part).to_bytes(8, "big"))
            mac.update(part)
        return mac.digest()

    def allows(self, web, header):
        """Whether the request's ``Authorization`` header (None when absent) names a user of ``web`` with the
        right password; True when ``web`` names no users."""
        if not web.users:
            return True
        credentials = parse_basic(header)
        if credentials is None:
            return False
        user, password = credentials
        known = web.users.get(user.decode("utf-8", "replace"))
        hashed = known if known is not None else web.decoy
        key = self._key(user, hashed, password)
        with self._lock:
            cached = key in self._answers[True] or (False if key in self._answers[False] else None)
        if cached is None:
            cached = self._check(hashed, password)
            with self._lock:
                answers = self._answers[cached]
                if len(answers) >= self.size:
                    del answers[next(iter(answers))]   # the oldest
                answers[key] = True
        return cached and known is not None

    def _check(self, hashed, password):
        import bcrypt   # loaded by web_config.WebConfig already, when it named users

        with self._bcrypt_lock:
            self.bcrypt_checks += 1
            try:
                return bcrypt.checkpw(password, hashed)
            except ValueError:
                return False


def parse_basic(header):
    """(user, password) as bytes from ``Basic <base64 of user:password>``; None when it is not that."""
    if not header:
        return None
    scheme, _space, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = decoded.partition(b":")
    return (user, password) if colon else None


class HandshakeLog:
    """Failed handshakes, logged at most once a minute each kind: a port scan must not fill the journal."""

    def __init__(self):
        self._last = {}

    def failed(self, address, reason):
        now = time.monotonic()
        if now - self._last.get(reason, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._last[reason] = now
            LOG.warning("metrics endpoint: a TLS connection from %s failed: %s (more like it are not logged "
                        "for %.0f s)", address[0] if address else "?", reason, LOG_EVERY_S)


def accept_tls(request, address, context, timeout, log):
    """The TLS connection on ``request`` (a just-accepted socket), or None once a failed one is closed.

    A client that speaks plain HTTP gets a 400 that says to use https, as Go's servers answer it.
    """
    request.settimeout(timeout)
    try:
        first = request.recv(1, socket.MSG_PEEK)
        if first and first[0] != TLS_HANDSHAKE:
            request.sendall(PLAIN_HTTP_ANSWER)
            log.failed(address, "plain HTTP to the TLS port (answered 400)")
            return None
        return context.wrap_socket(request, server_side=True)
    except (OSError, ssl.SSLError) as error:   # also a timeout
        log.failed(address, getattr(error, "reason", None) or str(error) or type(error).__name__)
        return None
