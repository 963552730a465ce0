# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Scv agent's Kubernetes client: HTTPS with the standard library only (private).

It runs on each node, where neither Ansible nor the kubernetes package is installed (and would
cost memory). It has the methods of ``client.ResourceClient`` (so ``scv.publisher`` works with
either), a watch, and the few Node calls the agent makes. Credentials come from
``kubeconfig.Credentials`` and follow their files when they are rotated.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import ssl
import threading
import time
import urllib.parse

from ansible_collections.scv.gpu.plugins.module_utils.common.backoff import TokenBucket
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError, is_missing_object, missing_definition
from ansible_collections.scv.gpu.plugins.module_utils.kube.kubeconfig import Credentials, file_signature, load_kubeconfig

USER_AGENT = "scv-gpu-agent"
# client-go's defaults for a client's own rate limit: a burst of 10 requests, then 5 a second.
DEFAULT_QPS = 5.0
DEFAULT_BURST = 10
# ``request``'s ``missing`` when a 404 is an error: no value stands for a missing object.
NO_DEFAULT = object()


class ApiContact:
    """Whether the API server answers, from every request of every thread: since when it has not, and how
    many attempts failed since its last answer. An answer of 429 or 5xx is no answer: the server is up but
    cannot serve (etcd away, overloaded)."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self.failing_since = None    # the clock time of the first failure since the last answer
        self.failures = 0            # failed attempts since the last answer
        self.failed_total = 0        # failed attempts since the agent started

    def reached(self, status):
        if status == 429 or status >= 500:
            self.failed()
            return
        with self._lock:
            self.failing_since, self.failures = None, 0

    def failed(self):
        with self._lock:
            self.failures += 1
            self.failed_total += 1
            if self.failing_since is None:
                self.failing_since = self._clock()

    def describe(self):
        """One phrase for /healthz: that the API server answers, or for how long and how often it did not."""
        with self._lock:
            since, failures = self.failing_since, self.failures
        if since is None:
            return "the API server answers"
        return "the API server has not answered for %.0f s (%d attempt%s failed)" % (
            self._clock() - since, failures, "" if failures == 1 else "s")


class RestTransport:
    """Requests to one API server with one kubeconfig's credentials, read again when their files change.

    ``kubeconfig`` is a parsed kubeconfig dict; file paths in it are relative to ``base_dir``.
    ``from_file`` reads a kubeconfig file and reads it again when it changes.

    Before each connection the transport looks at the kubeconfig and the certificate, key and
    token files (a kubelet's ``kubelet-client-current.pem`` is a symlink that rotation points
    elsewhere) and reads them again when one changed; a 401 or 403 makes it read them again
    and retry once when they differ. Every request gives up after ``timeout`` seconds without
    an answer. Every request, watches included, first takes a token from ``limiter`` (``qps`` a
    second after a burst of ``burst``), as client-go's clients do: a loop gone wrong cannot flood
    the API server.
    """

    def __init__(self, kubeconfig, base_dir=".", timeout=10.0, path=None, qps=DEFAULT_QPS, burst=DEFAULT_BURST):
        self.limiter = TokenBucket(qps, burst)
        self._path_name = path
        self._base_dir = base_dir
        self._timeout = timeout
        self._origin = "the kubeconfig %s" % path if path else "the kubeconfig"
        self._config_signature = file_signature(path) if path else None
        self._kubeconfig = None if path else kubeconfig   # read again from its files when it has a path
        self._credentials = Credentials(kubeconfig, base_dir, self._origin)
        self._signatures = {name: file_signature(name) for name in self._credentials.files}
        self.server = self._credentials.server
        self.requests = 0
        self.reloads = 0
        self.contact = ApiContact()

    @classmethod
    def from_file(cls, path, timeout=10.0, **options):
        path = os.path.abspath(path)
        try:
            kubeconfig = load_kubeconfig(path)
        except (OSError, ValueError) as error:
            raise ApiError("cannot read the kubeconfig %s: %s" % (path, error)) from error
        return cls(kubeconfig, os.path.dirname(path), timeout, path=path, **options)

    def _changed_on_disk(self):
        if self._path_name and file_signature(self._path_name) != self._config_signature:
            return True
        return any(file_signature(name) != signature for name, signature in self._signatures.items())

    @property
    def path(self):
        """The kubeconfig file read, or None for a kubeconfig given as a dict."""
        return self._path_name

    def reload(self, force=False):
        """Reads the credentials again when their files changed (or ``force``); True when they differ now.

        A reading that fails (a rotation caught half-way) keeps the credentials in use and says why.
        A client made from a kubeconfig dict reads the certificate, key and token files it names.
        """
        if not (force or self._changed_on_disk()):
            return False
        config_signature = file_signature(self._path_name) if self._path_name else None
        try:
            kubeconfig = self._kubeconfig
            if self._path_name:
                try:
                    kubeconfig = load_kubeconfig(self._path_name)
                except (OSError, ValueError) as error:
                    raise ApiError("cannot read the kubeconfig %s: %s" % (self._path_name, error)) from error
            credentials = Credentials(kubeconfig, self._base_dir, self._origin)
        except ApiError as error:
            logging.getLogger("scv-gpu-agent").warning("keeping the credentials in use: %s", error)
            return False
        changed = credentials.fingerprint != self._credentials.fingerprint or credentials.server != self.server
        self._credentials, self._config_signature = credentials, config_signature
        self._signatures = {name: file_signature(name) for name in credentials.files}
        self.server = credentials.server
        if changed:
            self.reloads += 1
        return changed

    def connection(self, timeout=None):
        self.reload()
        credentials = self._credentials
        return http.client.HTTPSConnection(credentials.host, credentials.port, context=credentials.ssl,
                                           timeout=self._timeout if timeout is None else timeout)

    def headers(self, content_type="application/json", accept="application/json"):
        headers = {"Accept": accept, "Content-Type": content_type, "User-Agent": USER_AGENT}
        if self._credentials.token:
            headers["Authorization"] = "Bearer " + self._credentials.token
        return headers

    def url(self, base, *parts, **query):
        """The path of ``base`` (a resource's path) and ``parts`` under the server's prefix, with a query."""
        path = self._credentials.prefix + base + "".join("/" + urllib.parse.quote(part, safe="") for part in parts)
        query = {key: value for key, value in query.items() if value is not None}
        return path + ("?" + urllib.parse.urlencode(query) if query else "")

    def unreachable(self, verb, target, error, timeout):
        if isinstance(error, ssl.SSLCertVerificationError):
            return ApiError("cannot %s %s: the API server at %s is not vouched for by %s (%s): is that this "
                            "cluster's CA? Check certificate-authority in %s" % (
                                verb, target, self.server, self._credentials.ca_source,
                                error.verify_message or error, self._path_name or "the kubeconfig"))
        if isinstance(error, socket.timeout):
            return ApiError("cannot %s %s: the Kubernetes API at %s did not answer within %g s"
                            % (verb, target, self.server, timeout))
        return ApiError("cannot %s %s: the Kubernetes API at %s is unreachable: %s"
                        % (verb, target, self.server, error))

    def _exchange(self, method, verb, target, path, body, content_type, accept="application/json"):
        """One request; (status, payload)."""
        self.limiter.take()
        self.requests += 1
        connection = self.connection()
        try:
            connection.request(method, path, body=None if body is None else json.dumps(body),
                               headers=self.headers(content_type, accept))
            response = connection.getresponse()
            answer = response.status, response.read()
        except (OSError, ValueError) as error:
            self.contact.failed()
            raise self.unreachable(verb, target, error, self._timeout) from error
        finally:
            connection.close()
        self.contact.reached(answer[0])
        return answer

    def request(self, method, verb, target, path, body=None, missing=NO_DEFAULT, content_type="application/json",
                resource=None, accept="application/json"):
        """The answer's JSON; ``missing`` for a 404 of an object that does not exist (an error without it).

        ``resource`` (an ApiResource) names a custom resource whose unserved type is reported as
        its definition missing. ``accept`` may ask for another form of the answer (objects' metadata only).
        """
        status, payload = self._exchange(method, verb, target, path, body, content_type, accept)
        if status in (401, 403) and self.reload(force=True):
            # Rotated credentials (a kubelet's client certificate): one more try with the new ones.
            status, payload = self._exchange(method, verb, target, path, body, content_type, accept)
        if status == 404:
            if resource is not None and resource.crd_name and not is_missing_object(payload):
                raise missing_definition(resource, self.server)
            if missing is not NO_DEFAULT:
                return missing
        if status >= 400:
            try:
                message = json.loads(payload).get("message") or payload.decode("utf-8", "replace")
            except (ValueError, AttributeError):
                message = payload.decode("utf-8", "replace")
            if status == 401:
                message += " (the credentials from %s were rejected; they are read again before the next request)" % (
                    self._path_name or "the kubeconfig")
                expiry = self._credentials.certificate_expiry
                if expiry is not None and expiry < time.time():
                    message += ": the client certificate %s expired on %s" % (
                        self._credentials.certificate_source,
                        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(expiry)))
            raise ApiError("cannot %s %s: HTTP %s from %s: %s" % (verb, target, status, self.server, message),
                           conflict=status == 409, status=status)
        return json.loads(payload) if payload else {}
