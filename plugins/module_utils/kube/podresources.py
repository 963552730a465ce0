# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The kubelet's pod-resources API: which pod and container holds which device (private to the collection).

The kubelet serves ``v1.PodResourcesLister`` over gRPC on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``). One unary call, ``List``, is all the agent needs,
so it is made by ``grpc_unary`` (HTTP/2 framed by hand, HPACK by ``hpack_codec``) and a decoder
of the few protobuf fields read here, instead of grpcio and protobuf (see
docs/benchmarks.md for what each adds to the agent's memory). Field numbers follow the kubelet's
published ``pkg/apis/podresources/v1/api.proto``.
"""

from __future__ import annotations

import hashlib
import socket
import struct
import time
from urllib.parse import unquote

from ansible_collections.scv.gpu.plugins.module_utils.kube import grpc_unary

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_PATH = "/v1.PodResourcesLister/List"
# The kubelet's own limit on a pod-resources answer is 16 MiB (a node of thousands of containers).
MAX_ANSWER_BYTES = 16 * 1024 * 1024
# The flow-control window the agent opens: the largest answer and the gRPC framing around it.
WINDOW = MAX_ANSWER_BYTES + 65536


DEADLINE_EXCEEDED = "4"


class PodResourcesError(Exception):
    """The kubelet's pod-resources API could not be read; the message says why and where."""


# ------------------------------------------------------------------ protobuf


def _varint(data, pos):
    value, shift = 0, 0
    while True:
        if pos >= len(data) or shift > 63:
            raise PodResourcesError("the kubelet's answer is not protobuf: a varint runs past its end")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(data):
    """(field number, value) of one protobuf message; length-delimited values as memoryviews of ``data``
    (no copy), others skipped."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    pos = 0
    while pos < len(view):
        key, pos = _varint(view, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _value, pos = _varint(view, pos)
            continue
        if wire == 2:
            length, pos = _varint(view, pos)
            if pos + length > len(view):
                raise PodResourcesError("the kubelet's answer is not protobuf: field %d is cut short" % number)
            yield number, view[pos:pos + length]
            pos += length
            continue
        if wire not in (1, 5):
            raise PodResourcesError("the kubelet's answer is not protobuf: wire type %d in field %d" % (wire, number))
        pos += 8 if wire == 1 else 4


def _message(data, numbers):
    """{field number: [values]} of one message's length-delimited fields among ``numbers``, in order."""
    found = {}
    for number, value in _fields(data):
        if number in numbers:
            found.setdefault(number, []).append(value)
    return found


def _string(message, number):
    """A string field of a ``_message``: its last value (proto3's rule for a field sent twice), or ''."""
    values = message.get(number)
    return str(values[-1], "utf-8", "replace") if values else ""


def _device_ids(device, keep):
    """The device IDs of a ContainerDevices message; with ``keep`` (a set of IDs), only those whose ID, without
    its ``::N`` replica suffix or what follows a ``/`` (GKE's ``nvidia0/vgpu1``, ``nvidia0/gi1``), is in it: the
    others are compared as bytes and never made into strings."""
    ids = []
    for number, value in _fields(device):
        if number != 2:
            continue
        if keep is not None and bytes(value).split(b"::", 1)[0].split(b"/", 1)[0] not in keep:
            continue
        ids.append(str(value, "utf-8", "replace"))
    return ids


def _claim(dynamic, drivers):
    """(claim name, claim namespace, [{"driver", "pool", "device", "cdi_devices"}]) of a DynamicResource message
    (claim_name 2, claim_namespace 3, claim_resources 4: ClaimResource's cdi_devices 1, driver_name 2, pool_name 3,
    device_name 4); with ``drivers`` (a set of driver names as bytes), the devices of those drivers alone."""
    claim = _message(dynamic, (2, 3, 4))
    devices = []
    for value in claim.get(4, ()):
        resource = _message(value, (1, 2, 3, 4))
        if drivers is not None and bytes(resource.get(2, (b"",))[-1]) not in drivers:
            continue
        devices.append({"driver": _string(resource, 2), "pool": _string(resource, 3), "device": _string(resource, 4),
                        "cdi_devices": [_string(_message(cdi, (1,)), 1) for cdi in resource.get(1, ())]})
    return _string(claim, 2), _string(claim, 3), devices


def decode_list_response(data, keep=None, drivers=None):
    """The devices of a ``ListPodResourcesResponse``: a list of dicts with ``namespace``, ``pod``,
    ``container``, ``resource`` and ``device_ids`` (one per container and resource). ``keep``, a set of
    device IDs as bytes, leaves out every other ID: a busy kubelet's thousands of devices of no GPU here
    are then never held in memory at once.

    Devices given through Dynamic Resource Allocation (a container's ``dynamic_resources``) follow, one dict per
    container and claim, with ``resource`` '' and no ``device_ids`` but ``claim_name``, ``claim_namespace`` and
    ``claim_devices`` (see ``_claim``); ``drivers``, a set of DRA driver names as bytes, leaves out the devices of
    every other driver (and a claim left with none)."""
    held, dynamic = [], []
    for pod_data in _message(data, (1,)).get(1, ()):                                   # pod_resources
        pod = _message(pod_data, (1, 2, 3))
        for container in (_message(value, (1, 2, 5)) for value in pod.get(3, ())):      # containers
            where = {"namespace": _string(pod, 2), "pod": _string(pod, 1), "container": _string(container, 1)}
            for device in container.get(2, ()):                                         # ContainerDevices
                held.append(dict(where, resource=_string(_message(device, (1,)), 1),
                                 device_ids=_device_ids(device, keep)))
            for value in container.get(5, ()):                                          # DynamicResource
                name, namespace, devices = _claim(value, drivers)
                if devices or drivers is None:
                    dynamic.append(dict(where, resource="", device_ids=[], claim_name=name, claim_namespace=namespace,
                                        claim_devices=devices))
    return held + dynamic


# ---------------------------------------------------------------------- gRPC


def _grpc_message(body, path):
    """The one message of a unary gRPC answer (a 5-byte prefix: compressed flag, big-endian length), as a
    memoryview of ``body`` (a large answer is not copied again)."""
    if not body:
        return memoryview(b"")
    if len(body) < 5:
        raise PodResourcesError("%s: the kubelet's answer is cut short (%d bytes)" % (path, len(body)))
    compressed, length = struct.unpack_from(">BI", body)
    if compressed:
        raise PodResourcesError("%s: the kubelet compressed its answer, which was not asked for" % path)
    if len(body) < 5 + length:
        raise PodResourcesError("%s: the kubelet's answer is cut short (%d of %d bytes)"
                                % (path, len(body) - 5, length))
    return memoryview(body)[5:5 + length]


def _open(path, timeout):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except FileNotFoundError:
        sock.close()
        raise PodResourcesError("no kubelet pod-resources socket at %s (is the kubelet running, and is that its "
                                "root directory?)" % path) from None
    except OSError as error:
        sock.close()
        raise PodResourcesError("cannot connect to the kubelet's pod-resources socket %s: %s"
                                % (path, error.strerror or error)) from None
    return sock


def call(path, method, request=b"", timeout=2.0):
    """The answer (protobuf bytes, as a memoryview) of the unary gRPC ``method`` served on the unix socket ``path``.

    Bounded by ``timeout`` seconds in all; PodResourcesError says what went wrong.
    """
    deadline = time.monotonic() + timeout
    sock = _open(path, timeout)
    reader = grpc_unary.Reader(MAX_ANSWER_BYTES)
    try:
        grpc_unary.exchange(sock, grpc_unary.request("localhost", method, request, timeout, WINDOW), reader, deadline)
    except socket.timeout:
        raise PodResourcesError("the kubelet did not answer %s on %s within %g s" % (method, path, timeout)) from None
    except ConnectionAbortedError:
        raise PodResourcesError("%s: the kubelet closed the connection before it answered" % path) from None
    except grpc_unary.AnswerTooLarge:
        raise PodResourcesError("%s: the kubelet's answer is over %d bytes" % (path, MAX_ANSWER_BYTES)) from None
    except grpc_unary.ProtocolError as error:
        raise PodResourcesError("%s does not speak gRPC over HTTP/2: %s" % (path, error)) from None
    except grpc_unary.StreamError as error:
        raise PodResourcesError("%s: the kubelet %s (HTTP/2 error %s)" % (
            path, "ended the connection" if error.goaway else "reset the call", error.code)) from None
    except OSError as error:
        raise PodResourcesError("%s: %s" % (path, error.strerror or error)) from None
    finally:
        sock.close()
    headers = reader.headers
    status = headers.get("grpc-status")
    if status == DEADLINE_EXCEEDED:    # the kubelet kept to the grpc-timeout sent
        raise PodResourcesError("the kubelet did not answer %s on %s within %g s" % (method, path, timeout))
    if status != "0":
        raise PodResourcesError("the kubelet refused %s on %s: gRPC status %s%s" % (
            method, path, status if status is not None else "missing (HTTP %s)" % headers.get(":status"),
            ": " + unquote(headers["grpc-message"]) if headers.get("grpc-message") else ""))
    return _grpc_message(reader.body, path)


def list_pod_resources(path=DEFAULT_SOCKET, timeout=2.0):
    """Every device the kubelet has given a container, through a device plugin or a DRA claim: see
    ``decode_list_response``."""
    return decode_list_response(call(path, LIST_PATH, b"", timeout))


UNCHANGED = object()


class PodResourcesLister:
    """``list_pod_resources`` that knows its last answer by digest: an answer byte for byte the same, read for
    the same ``keep``, is not decoded again, and UNCHANGED is returned in its place, so that callers keep what
    they worked out from it. A busy kubelet's answer naming thousands of devices then costs its transfer
    alone, and neither it nor its decoded form is kept in memory."""

    def __init__(self):
        self._digest = None

    def __call__(self, path=DEFAULT_SOCKET, timeout=2.0, keep=None, drivers=None):
        message = call(path, LIST_PATH, b"", timeout)
        digest = (hashlib.sha256(message).digest(), keep, drivers)
        if digest == self._digest:
            return UNCHANGED
        held = decode_list_response(message, keep, drivers)
        self._digest = digest
        return held
