"""Every module's and filter's documentation loads in ansible-doc, on each ansible-core line the collection
supports (sanity checks the documentation on the newest line only)."""

from __future__ import annotations

import json
import subprocess

import pytest

from harness.paths import ROOT


def _names(kind, suffix):
    folder = ROOT / "plugins" / kind
    return ["scv.gpu." + path.stem for path in sorted(folder.glob("*" + suffix)) if not path.stem.startswith("_")]


@pytest.mark.every_ansible_line
@pytest.mark.parametrize("kind, names", [("module", _names("modules", ".py")), ("filter", _names("filter", ".yml"))])
def test_every_plugins_documentation_loads(ansible, kind, names):
    done = subprocess.run([str(ansible.venv / "bin" / "ansible-doc"), "-t", kind, "--json"] + names,
                          env=ansible.env(), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    docs = json.loads(done.stdout)
    assert sorted(docs) == sorted(names), sorted(set(names) ^ set(docs))
    for name, doc in docs.items():
        assert doc["doc"]["short_description"], name
