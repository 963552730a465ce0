# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """What the modules that edit a container runtime's configuration file share: the file (``path``),
    its backup, check and diff mode. Each module says in its notes whether a change needs a restart.

    Each module gives ``path`` its own default, and ``backup_file`` its own sample.
    """

    DOCUMENTATION = r"""
options:
  path:
    description:
      - The runtime's configuration file. It is written only when its content changes, atomically (a temporary
        file renamed over it), keeping its owner and mode.
    type: path
  backup:
    description:
      - Keep a copy of the previous file, its name stamped with the time, before a change is written.
      - The copy's name is returned in RV(backup_file).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    support: full
    platforms: posix
"""

    RETURN = r"""
backup_file:
  description: The copy of the previous file.
  returned: when O(backup=true) and the file changed
  type: str
"""
