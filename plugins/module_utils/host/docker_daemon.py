# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Docker's daemon.json on a host, merged: read through a symbolic link, checked against the flags
dockerd gets from its systemd unit and by ``dockerd --validate`` (private; docker_daemon_config's work).

``daemon_json`` holds the file's rules (parse, merge, render, the flags that clash); this file
applies them to the host. The functions that run dockerd take the AnsibleModule.
"""

from __future__ import annotations

import os

from ansible_collections.scv.gpu.plugins.module_utils.host.daemon_json import (
    DaemonJsonError,
    canonical,
    conflicts,
    dockerd_flags,
    merge,
    parse,
    render,
    validation_verdict,
)
from ansible_collections.scv.gpu.plugins.module_utils.host.files import read_text
from ansible_collections.scv.gpu.plugins.module_utils.host.systemd import unit_files

VALIDATE_TIMEOUT_S = 60
DOCKERD_DIRS = ["/usr/bin", "/usr/sbin", "/usr/local/bin"]


def written_path(path):
    """The file a change to ``path`` is written to: the target of a symbolic link, whose folder must exist.

    A symlinked daemon.json (configuration kept elsewhere) is written through: the target changes,
    the link stays. Writing over the link would leave its target stale and unlinked.
    """
    target = os.path.realpath(path) if os.path.islink(path) else path
    if target != path and not os.path.isdir(os.path.dirname(target)):
        raise DaemonJsonError("%s is a symbolic link to %s, whose folder does not exist; fix the link or remove "
                              "it, nothing was written" % (path, target))
    return target


def read_document(path, target):
    """(text, document) of the daemon.json at ``target`` (``path`` as given): text None when it is missing."""
    try:
        previous = read_text(target)
    except UnicodeDecodeError as error:
        raise DaemonJsonError("%s is not UTF-8 text (byte %d); fix it, the file was left untouched"
                              % (path, error.start)) from error
    return previous, parse(previous or "", path if target == path else "%s (-> %s)" % (path, target))


def check_unit_flags(path, document, unit, search_paths):
    """Raises DaemonJsonError when ``document`` sets what dockerd also gets as a flag from ``unit``."""
    clashes = conflicts(document, dockerd_flags(unit_files(unit, search_paths)))
    if clashes:
        raise DaemonJsonError(
            "%s would set %s, which dockerd also gets as a flag (%s); Docker refuses to start with a "
            "setting in both places. Remove the flag from the unit (a drop-in with an empty ExecStart= "
            "and a new one) or leave the setting out of daemon.json; nothing was written"
            % (path, ", ".join(key for key, _flag in clashes), "; ".join(flag for _key, flag in clashes)))


def dockerd_verdict(module, name, text):
    """(accepted, detail) of ``dockerd --validate`` (dockerd ``name``) on ``text``: accepted is None when it
    cannot tell."""
    dockerd = name if "/" in name else module.get_bin_path(name, opt_dirs=DOCKERD_DIRS)
    if not dockerd or not os.access(dockerd, os.X_OK):
        return None, "no dockerd found (%s)" % name
    candidate = os.path.join(module.tmpdir, "daemon.json")
    with open(candidate, "w", encoding="utf-8") as handle:
        handle.write(text)
    command = [dockerd, "--validate", "--config-file", candidate]
    timeout = module.get_bin_path("timeout")
    rc, out, err = module.run_command(([timeout, str(VALIDATE_TIMEOUT_S)] if timeout else []) + command)
    accepted, detail = validation_verdict(rc, out + err)
    return accepted, detail if accepted is not False else "%s --validate refuses it: %s" % (dockerd, detail)


def check_with_dockerd(module, path, previous, text, name="dockerd", validate="auto"):
    """What ``validation`` returns; raises DaemonJsonError when dockerd refuses ``text``, or cannot check it
    and ``validate`` is ``always``."""
    accepted, detail = dockerd_verdict(module, name, text)
    if accepted:
        return "accepted by %s --validate" % name
    if accepted is None:
        if validate == "always":
            raise DaemonJsonError("validate is always, but the new %s cannot be checked: %s; nothing was written"
                                  % (path, detail))
        return "not checked: %s" % detail
    if previous and previous.strip() and dockerd_verdict(module, name, previous)[0] is False:
        raise DaemonJsonError("%s is refused by Docker already, before the merge: %s. Fix the file (Docker does not "
                              "start with it either); nothing was written" % (path, detail))
    raise DaemonJsonError("the merged %s would be refused by Docker: %s. Check the settings option; nothing was "
                          "written" % (path, detail))


def merged_daemon_json(module):
    """docker_daemon_config's change, worked out from ``module.params`` and checked, nothing written:
    a dict of ``target`` (the file to write), ``previous`` (its text, None when missing), ``text`` (what
    it should hold), ``config`` (the merged document), ``changed`` and ``validation``.

    Raises DaemonJsonError for a file or a merge that cannot be written, OSError for a file or unit that
    cannot be read.
    """
    params = module.params
    path = params["path"]
    target = written_path(path)
    previous, document = read_document(path, target)
    merged = merge(document, params["runtime_path"], params["runtime_args"], params["default_runtime"],
                   params["settings"])
    if params["check_unit_flags"]:
        check_unit_flags(path, merged, params["unit"], params["unit_search_paths"])
    changed = previous is None or canonical(merged) != canonical(document)
    text = render(merged, previous or "") if changed else previous
    if not changed:
        validation = "not checked: unchanged"
    elif params["validate"] == "never":
        validation = "not checked: validate is never"
    else:
        validation = check_with_dockerd(module, path, previous, text, params["dockerd"], params["validate"])
    return dict(target=target, previous=previous, text=text, config=merged, changed=changed, validation=validation)
