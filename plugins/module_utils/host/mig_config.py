# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A MIG layout as the mig_layout module is given it: inline, or by name from an nvidia-mig-parted
configuration, as a mapping or a file on the host (private)."""

from __future__ import annotations

import json

from ansible_collections.scv.gpu.plugins.module_utils.common.mig_layout import LayoutError, from_config, normalise

try:
    import yaml
except ImportError:
    yaml = None

# PyYAML's errors are no ValueError: a broken file must still be reported as one, not as a traceback.
PARSE_ERRORS = (ValueError, yaml.YAMLError) if yaml else (ValueError,)


def read_config_file(path):
    """The configuration in the YAML (or, without PyYAML, JSON) file ``path``; LayoutError naming the file."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise LayoutError("config_file %s cannot be read: %s" % (path, error.strerror))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise LayoutError("config_file %s is not UTF-8 text: byte 0x%02x at offset %d cannot be read; save it as "
                          "UTF-8" % (path, data[error.start], error.start))
    try:
        return yaml.safe_load(text) if yaml else json.loads(text)
    except PARSE_ERRORS as error:
        raise LayoutError("config_file %s is not valid YAML: %s" % (path, error))
    except RecursionError:
        raise LayoutError("config_file %s is not a MIG configuration: it is nested too deeply to read" % path)


def layout_entries(layout=None, config=None, config_file=None, config_name=None):
    """The checked entries of ``layout``, or of the layout ``config_name`` of ``config_file`` or ``config``."""
    if layout is not None:
        return normalise(layout)
    if config_file:
        return from_config(read_config_file(config_file), config_name, config_file)
    return from_config(config, config_name, "config")
