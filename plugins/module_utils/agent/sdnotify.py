# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""systemd's notification protocol (sd_notify), with the standard library (private).

A ``Type=notify`` unit is started once the service says ``READY=1``; with ``WatchdogSec`` set,
systemd restarts a service that stops saying ``WATCHDOG=1`` in time. Outside systemd
(no ``NOTIFY_SOCKET``) every call does nothing.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    """Sends notifications to the socket systemd names in ``NOTIFY_SOCKET``."""

    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        address = environ.get("NOTIFY_SOCKET") or ""
        if address.startswith("@"):
            address = "\0" + address[1:]   # an abstract socket
        self.address = address or None
        self.watchdog_s = None
        watchdog_usec = environ.get("WATCHDOG_USEC")
        watchdog_pid = environ.get("WATCHDOG_PID")
        if watchdog_usec and watchdog_usec.isdigit() and (not watchdog_pid or watchdog_pid == str(os.getpid())):
            self.watchdog_s = int(watchdog_usec) / 1e6

    def __call__(self, *words):
        """Sends ``words`` (``READY=1``, ``WATCHDOG=1``, ...) as one notification; False when none was sent."""
        if self.address is None or not words:
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.connect(self.address)
                sock.sendall("\n".join(words).encode())
            except OSError:
                return False
        return True
