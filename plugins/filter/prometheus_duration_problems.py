# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The roles' Prometheus durations checked with Prometheus's own grammar before anything changes."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.scv.gpu.plugins.module_utils.common.prometheus_duration import duration_problem


def scv_gpu_prometheus_duration_problems(durations):
    """One message per variable whose value Prometheus would refuse as a duration: {variable: value}."""
    if not isinstance(durations, dict):
        raise AnsibleFilterError("prometheus_duration_problems: pass a mapping of variable names to durations")
    return ["%s: %s" % (name, duration_problem(value)) for name, value in sorted(durations.items())
            if duration_problem(value)]


class FilterModule:
    def filters(self):
        return {"prometheus_duration_problems": scv_gpu_prometheus_duration_problems}
