#!/usr/bin/python
# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: validation_report
short_description: Write the report of a GPU node validation - a table, JUnit XML and the AI Conformance evidence
version_added: 2.0.0
description:
  - Writes the results of M(scv.gpu.host_validate) and M(scv.gpu.node_validate) for every node in O(dest), as three files.
  - C(validation.md), a table with a row per node and a column per check, then the reason of every failure;
  - C(validation.junit.xml), a test suite per node and a test case per check, which CI systems read;
  - C(validation.conformance.json), each requirement of the CNCF Kubernetes AI Conformance the checks are evidence
    for (C(secure_accelerator_access), C(driver_runtime_management), ...), its level, whether it held on every
    node, and the checks behind it.
  - Each file is written atomically, only when its content changes; the files hold no time stamp, so a second run
    with the same results changes nothing.
  - Fails when a check failed and O(fail_on_failure) is true, after writing the report, naming each node and
    check and why.
author:
  - scv.gpu contributors (!UNKNOWN)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
options:
  results:
    description: The checks, as RV(scv.gpu.node_validate#module:checks) returns them, of every node.
    type: list
    elements: dict
    required: true
  dest:
    description: The folder the report goes in; created when missing.
    type: path
    required: true
  fail_on_failure:
    description: Fail when any check failed.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    details: Writes nothing, and says which files would change.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Write the report, and fail when a node failed a check
  scv.gpu.validation_report:
    results: "{{ groups['gpu_nodes'] | map('extract', hostvars, ['scv_gpu_validation', 'checks']) | flatten }}"
    dest: "{{ playbook_dir }}/validation"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
files:
  description: The report's files.
  returned: always
  type: list
  elements: path
  sample: [/srv/validation/validation.md, /srv/validation/validation.junit.xml,
           /srv/validation/validation.conformance.json]
table:
  description: The content of C(validation.md).
  returned: always
  type: str
failed_checks:
  description: The checks that failed, as given.
  returned: always
  type: list
  elements: dict
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.scv.gpu.plugins.module_utils.node.validation import (
    CHECKS, FAILED, PASSED, SKIPPED, conformance, junit, table)

FILES = (("validation.md", table), ("validation.junit.xml", junit), ("validation.conformance.json", conformance))


def _checked(results):
    """The results, each checked for the keys and values the report needs; (results, problem)."""
    checked = []
    for position, item in enumerate(results):
        if not isinstance(item, dict):
            return None, "results[%d]: expected a check (a dict), got %r" % (position, item)
        missing = [key for key in ("node", "check", "outcome") if not item.get(key)]
        if missing:
            return None, "results[%d]: %s missing" % (position, ", ".join(missing))
        if item["check"] not in CHECKS:
            return None, "results[%d]: unknown check %r (known: %s)" % (position, item["check"], ", ".join(CHECKS))
        if item["outcome"] not in (PASSED, FAILED, SKIPPED):
            return None, "results[%d]: outcome %r is not passed, failed or skipped" % (position, item["outcome"])
        checked.append({"node": str(item["node"]), "check": item["check"], "outcome": item["outcome"],
                        "reason": str(item.get("reason") or "")})
    return checked, None


def _write(module, path, text):
    """Writes ``text`` to ``path`` atomically when it differs; whether it did (or would)."""
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return False
    except OSError:
        pass
    if module.check_mode:
        return True
    handle, staged = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".%s." % os.path.basename(path))
    with os.fdopen(handle, "w", encoding="utf-8") as staged_file:
        staged_file.write(text)
    os.chmod(staged, 0o644)
    module.atomic_move(staged, path)
    return True


def main():
    module = AnsibleModule(argument_spec=dict(
        results=dict(type="list", elements="dict", required=True),
        dest=dict(type="path", required=True),
        fail_on_failure=dict(type="bool", default=True),
    ), supports_check_mode=True)
    results, problem = _checked(module.params["results"])
    if problem:
        module.fail_json(msg="%s; no report was written" % problem)
    if not results:
        module.fail_json(msg="results: no check was given, so there is nothing to report; no report was written")
    dest = module.params["dest"]
    if os.path.exists(dest) and not os.path.isdir(dest):
        module.fail_json(msg="dest: %s is not a folder; no report was written" % dest)
    if not os.path.isdir(dest) and not module.check_mode:
        os.makedirs(dest, 0o755)
    changed, files = False, []
    for name, render in FILES:
        path = os.path.join(dest, name)
        files.append(path)
        changed = _write(module, path, render(results)) or changed
    failed = [item for item in results if item["outcome"] == FAILED]
    outcome = dict(changed=changed, files=files, table=table(results), failed_checks=failed)
    if failed and module.params["fail_on_failure"]:
        module.fail_json(msg="validation failed: %s (report in %s)" % (
            "; ".join("%s %s: %s" % (item["node"], item["check"], " ".join(item["reason"].split()))
                      for item in failed), dest), **outcome)
    module.exit_json(**outcome)


if __name__ == "__main__":
    main()
