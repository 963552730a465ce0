"""The agent's zipapp: built from the agent's imports, not from a list, and the same bytes every time."""

from __future__ import annotations

import hashlib
import io
import pathlib
import shutil
import zipfile

from ansible_collections.scv.gpu.plugins.plugin_utils import _agent_zipapp as agent_zipapp

PACKAGE_DIR = "ansible_collections/scv/gpu/plugins/module_utils/"


def _names(data):
    return sorted(zipfile.ZipFile(io.BytesIO(data)).namelist())


def test_the_archive_holds_the_entry_module_and_what_it_imports():
    data = agent_zipapp.build()
    names = _names(data)
    modules = {name[len(PACKAGE_DIR):] for name in names if name.startswith(PACKAGE_DIR)
               and not name.endswith("__init__.py")}
    utils = pathlib.Path(agent_zipapp.collection_root()) / "plugins" / "module_utils"
    closure = agent_zipapp.import_closure()
    assert modules == {pathlib.Path(path).relative_to(utils).as_posix() for path in closure.values()
                       if not path.endswith("__init__.py")}
    # What the agent needs, found by following imports: the loop, its own API client, NVML and the Scv fields.
    assert {"agent/main.py", "agent/loop.py", "kube/rest_client.py", "nvml/session.py", "scv/status.py",
            "scv/publisher.py"} <= modules
    # Nothing the agent does not import: the modules' client and the host helpers stay out.
    assert not modules & {"kube/client.py", "kube/module.py", "host/daemon_json.py", "host/containerd.py",
                          "host/driver.py", "host/files.py", "node/labels.py", "nvml/probe.py"}
    assert "__main__.py" in names
    assert "ansible_collections/__init__.py" in names


def test_the_build_is_reproducible():
    assert hashlib.sha256(agent_zipapp.build()).digest() == hashlib.sha256(agent_zipapp.build()).digest()
    info = zipfile.ZipFile(io.BytesIO(agent_zipapp.build())).infolist()
    assert {entry.date_time for entry in info} == {agent_zipapp.FIXED_TIME}


def test_a_new_import_anywhere_in_the_agent_is_followed(tmp_path):
    """A module the agent starts importing (inside a function, through another module) joins the archive."""
    root = tmp_path / "collection"
    shutil.copytree(pathlib.Path(agent_zipapp.collection_root()) / "plugins" / "module_utils",
                    root / "plugins" / "module_utils")
    utils = root / "plugins" / "module_utils"
    (utils / "common" / "new_helper.py").write_text("VALUE = 1\n")
    (utils / "common" / "new_reader.py").write_text(
        "def read():\n    from ansible_collections.scv.gpu.plugins.module_utils.common import new_helper\n"
        "    return new_helper.VALUE\n")
    rest = utils / "kube" / "rest.py"
    rest.write_text(rest.read_text() + "\n\ndef _later():\n"
                    "    from ansible_collections.scv.gpu.plugins.module_utils.common.new_reader import read\n"
                    "    return read()\n")
    modules = {pathlib.Path(path).name for path in agent_zipapp.import_closure(str(root)).values()}
    assert {"new_reader.py", "new_helper.py"} <= modules
    assert {"new_reader.py", "new_helper.py"} <= {pathlib.Path(n).name for n in _names(agent_zipapp.build(str(root)))}


def test_write_replaces_the_file_atomically_and_returns_its_digest(tmp_path):
    target = tmp_path / "scv-gpu-agent.pyz"
    target.write_bytes(b"an older agent")
    digest = agent_zipapp.write(str(target))
    assert hashlib.sha256(target.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scv-gpu-agent.pyz"]
