"""A module's main() run in this process, as Ansible would run it, for the tests that need its whole result
(Ansible's one-line output drops the diff) or run it many times."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args


def run_module(capsys, module, args):
    """(exit code, result) of ``module.main()`` given ``args``; it must exit, as every Ansible module does."""
    with patch_module_args(args), pytest.raises(SystemExit) as exit_info:
        module.main()
    return exit_info.value.code, json.loads(capsys.readouterr().out)
