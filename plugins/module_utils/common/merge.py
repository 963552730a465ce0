# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Merging nested mappings, as configuration files layer them (private)."""

from __future__ import annotations

import copy


def deep_merge(base, extra):
    """A new mapping: ``base`` with ``extra`` laid over it; mappings on both sides merge key by key.

    Anything else in ``extra`` (lists included) replaces what ``base`` holds. Neither input changes.
    """
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
