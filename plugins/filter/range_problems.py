# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The roles' numeric variables checked against their limits before anything changes."""

from __future__ import annotations

import math

from ansible.errors import AnsibleFilterError


def _number(value):
    """``value`` as a number (int or float, or their text), or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else None
    try:
        number = float(str(value).strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def scv_gpu_range_problems(limits):
    """One message per variable outside its limits: [{'name', 'value', 'low', 'high', 'unit', 'whole'}]."""
    if not isinstance(limits, list):
        raise AnsibleFilterError("range_problems: pass a list of {name, value, low, high} mappings")
    problems = []
    for limit in limits:
        try:
            name, value, low, high = limit["name"], limit["value"], limit["low"], limit["high"]
        except (KeyError, TypeError):
            raise AnsibleFilterError("range_problems: each item needs name, value, low and high, got %r"
                                     % (limit,)) from None
        unit = " (%s)" % limit["unit"] if limit.get("unit") else ""
        number = _number(value)
        whole = limit.get("whole", False)
        if number is None or (whole and number != int(number)):
            problems.append("%s: %r is not a %s; expected one from %s to %s%s"
                            % (name, value, "whole number" if whole else "number", low, high, unit))
        elif not low <= number <= high:
            problems.append("%s: %s is out of range; expected a number from %s to %s%s"
                            % (name, value, low, high, unit))
    return problems


class FilterModule:
    def filters(self):
        return {"range_problems": scv_gpu_range_problems}
