# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The agent's Events on its Node, recorded as Kubernetes' own event recorder records them (private).

- **Deduplicated.** An Event with the reason, type and message of one the agent already emitted
  for the same Node is not created again: the existing one gets ``count`` + 1 and a new
  ``lastTimestamp`` (one PATCH). A card that flaps between Healthy and Unhealthy leaves two
  Events with growing counts, not one object per flap.
- **Spam-limited.** At most EVENT_BURST Events (creations and count updates) per node, then one
  every EVENT_REFILL_S seconds; what is over is dropped, counted and logged once per run of drops.
  These are client-go's defaults for its event recorder.
"""

from __future__ import annotations

import collections
import logging
import time

from ansible_collections.scv.gpu.plugins.module_utils.agent.condition import transition_event
from ansible_collections.scv.gpu.plugins.module_utils.common.backoff import TokenBucket
from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError

LOG = logging.getLogger("scv-gpu-agent")
EVENT_BURST = 25
EVENT_REFILL_S = 300.0
# Events remembered for deduplication; the API server's event TTL (1 h by default) ends them sooner or later.
SEEN_LIMIT = 64


class EventRecorder:
    """Creates or counts the Node's Events for ``client`` (with ``create_event`` and ``patch_event``)."""

    def __init__(self, client, node, counters, component, clock=time.monotonic):
        self.client = client
        self.node = node
        self.counters = counters
        self.component = component
        self.spam = TokenBucket(1.0 / EVENT_REFILL_S, EVENT_BURST, clock=clock)
        self._seen = collections.OrderedDict()   # (node uid, type, reason, message) -> [namespace, name, count]
        self._dropping = False

    def record(self, node, status, reason, message, now):
        """One Event for a change of the condition to (status, reason, message) on ``node`` (the Node object)."""
        event = transition_event(node, status, reason, message, now=now, component=self.component)
        if not self.spam.try_take():
            self.counters.bump("events_dropped")
            if not self._dropping:
                LOG.warning("Node %s: more than %d Events in a row; dropping them until the limit allows one "
                            "every %d s (this one: %s, %s)", self.node, EVENT_BURST, EVENT_REFILL_S, reason, message)
            self._dropping = True
            return
        self._dropping = False
        key = (event["involvedObject"].get("uid"), event["type"], reason, message)
        seen = self._seen.get(key)
        if seen is not None:
            namespace, name, count = seen
            try:
                self.client.patch_event(namespace, name, {"count": count + 1, "lastTimestamp": now})
            except ApiError as error:
                if error.status != 404:
                    raise
                # The Event is gone (its TTL ran out, or someone deleted it): a new one.
                del self._seen[key]
            else:
                seen[2] = count + 1
                self._seen.move_to_end(key)
                self.counters.bump("events")
                return
        created = self.client.create_event(event) or event
        metadata = created.get("metadata") or event["metadata"]
        self._seen[key] = [metadata.get("namespace", "default"), metadata.get("name"), 1]
        while len(self._seen) > SEEN_LIMIT:
            self._seen.popitem(last=False)
        self.counters.bump("events")
