# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which pod a process on this node belongs to, from the kubelet's files on the node (private).

Two of the kubelet's conventions, both local, neither needing the API server:

- A container's processes live in the pod's cgroup, whose path names the pod's UID: ``.../pod<uid>/...``
  with the cgroupfs driver, ``.../kubepods-<qos>-pod<uid with _ for ->.slice/...`` with systemd's. A
  static pod's UID is 32 hex digits with no dashes. ``/proc/<pid>/cgroup`` holds the path (cgroup v1:
  one line per hierarchy; v2: one line).
- The kubelet keeps each pod's container logs in ``<pod logs dir>/<namespace>_<pod name>_<pod UID>``
  (``/var/log/pods`` unless its ``podLogsDir`` says otherwise). Namespaces and pod names hold no ``_``,
  so a directory name splits into the three. The pod-resources API names pods but not their UIDs: this
  is what ties a UID to a name there.
"""

from __future__ import annotations

import os
import re

DEFAULT_POD_LOGS_DIR = "/var/log/pods"
# "pod" then a UID, its dashes turned to underscores by systemd's driver, or a static pod's 32 hex digits
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})"
                      r"(?![0-9a-f])")


def pod_uid_of_cgroup(text):
    """The pod UID a ``/proc/<pid>/cgroup`` text names, or None (a process of no pod)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        found = _POD_UID.search(path)
        if found:
            return found.group(1).replace("_", "-")
    return None


def pod_uid_of_pid(pid, proc="/proc"):
    """The UID of the pod process ``pid`` runs in, or None: no pod, or the process ended."""
    try:
        with open("%s/%d/cgroup" % (proc, pid), encoding="utf-8", errors="replace") as handle:
            return pod_uid_of_cgroup(handle.read())
    except OSError:
        return None


class PodNames:
    """{pod UID: (namespace, pod name)} from the kubelet's pod logs directory, listed again only when it changed."""

    def __init__(self, directory=DEFAULT_POD_LOGS_DIR):
        self.directory = directory
        self.listings = 0          # times the directory was listed
        self._stamp = None         # the directory's mtime when last listed
        self._names = {}

    def names(self, again=False):
        """The pods the directory names now; {} when it cannot be read. ``again`` lists it even if its mtime is
        the same: a pod added within the file system's timestamp step after the last listing does not move it."""
        try:
            stamp = os.stat(self.directory).st_mtime_ns
        except OSError:
            self._stamp, self._names = None, {}
            return self._names
        if again or stamp != self._stamp:
            self._names = self._list()
            self._stamp = stamp
        return self._names

    def _list(self):
        self.listings += 1
        found = {}
        try:
            entries = os.listdir(self.directory)
        except OSError:
            return found
        for entry in entries:
            parts = entry.split("_")
            if len(parts) == 3 and all(parts):
                found[parts[2]] = (parts[0], parts[1])
        return found
