"""containerd_config_info's main(), in-process, on real files; and the DRA check judging what it read.

Each case reads the files as the dra_driver role does on a host (the module) and hands the result to
the role's filter as prerequisites.yml does, so the imports are found, ordered and merged as
containerd finds, orders and merges them: the last file wins, 1.x (config version 2) takes a plugin
section an import names whole, 2.x (version 3) merges it key by key.
"""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.filter.dra_driver_problems import scv_gpu_dra_driver_problems
from ansible_collections.scv.gpu.plugins.modules import containerd_config_info
from harness.in_process import run_module

V2 = '[plugins."io.containerd.grpc.v1.cri"]\n'
V3 = '[plugins."io.containerd.cri.v1.runtime"]\n'
READY = {"node_name": "gpu-7", "stack": "dra", "check_label": False, "prerequisites": True,
         "node": {"metadata": {"labels": {}}, "status": {"nodeInfo": {"kubeletVersion": "v1.37.1"}}},
         "gpu_facts": {"nvml_available": True, "driver_version": "580.95.05"}, "min_driver_version": "565",
         "min_kubelet_version": "1.34.2", "api_found": True, "compute_domain_api_found": True, "runtime": "containerd",
         "containerd_path": None, "containerd_config": None, "containerd_imports": [], "containerd_error": None,
         "crio_reads": [], "cdi_refresh": {"rc": 0, "stdout": "unchanged"}, "cdi_spec": "/etc/cdi/nvidia.yaml"}


@pytest.fixture(autouse=True, params=["python-3.11", "python-3.10"])
def host_python(request, monkeypatch):
    """Each case on a host with tomllib, and on one without it (Ubuntu 22.04's Python 3.10), where the module
    reads only the top-level version and imports and the filter parses the texts whole."""
    if request.param == "python-3.10":
        monkeypatch.setattr(containerd_config_info, "tomllib", None)
    return request.param


@pytest.fixture
def etc(tmp_path):
    """A host's /etc/containerd: write(name, text) puts a file there (folders made as needed)."""
    root = tmp_path / "etc" / "containerd"

    def write(name, text):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path
    write.root = root
    return write


def read(capsys, main):
    return run_module(capsys, containerd_config_info, {"path": str(main)})


def judged(capsys, main):
    """The role's refusals for the node whose containerd reads ``main``: [] when CDI is fine."""
    result = read(capsys, main)[1]
    checks = dict(READY, containerd_path=str(main), containerd_config=result.get("content"),
                  containerd_imports=result.get("imports", []),
                  containerd_error=None if "imports" in result else result.get("msg"))
    return [line[len("node gpu-7: "):] for line in scv_gpu_dra_driver_problems(checks)]


def test_the_module_returns_the_main_file_and_its_imports_in_containerds_order(capsys, etc):
    main = etc("config.toml", 'version = 3\nimports = ["conf.d/*.toml", "site.toml"]\n')
    etc("conf.d/20-b.toml", 'version = 3\nimports = ["../nested/n.toml"]\n')
    etc("conf.d/10-a.toml", "version = 3\n")
    etc("conf.d/notes.txt", "not toml")
    etc("site.toml", 'version = 3\nimports = ["conf.d/10-a.toml", "config.toml"]\n')   # both read already
    etc("nested/n.toml", "version = 3\n")
    code, result = read(capsys, main)
    assert code == 0 and result["changed"] is False and result["version"] == 3
    assert result["content"] == main.read_text()
    root = str(etc.root)
    # breadth first: the main file's imports (a glob in name order, then a relative path), then theirs
    assert [(entry["path"][len(root) + 1:], entry["imported_by"][len(root) + 1:]) for entry in result["imports"]] == [
        ("conf.d/10-a.toml", "config.toml"), ("conf.d/20-b.toml", "config.toml"), ("site.toml", "config.toml"),
        ("nested/n.toml", "conf.d/20-b.toml")]
    assert result["imports"][1]["content"] == 'version = 3\nimports = ["../nested/n.toml"]\n'


@pytest.mark.parametrize("main, imported, problem", [
    # containerd 2.x: an import turns CDI off, or back on over a main file that turned it off
    ('version = 3\nimports = ["conf.d/*.toml"]\n', V3 + "  enable_cdi = false\n",
     "{dropin} (imported by {main}) turns CDI off (io.containerd.cri.v1.runtime.enable_cdi = false), and containerd "
     "merges it over the main file; set enable_cdi = true there, then restart containerd"),
    ('version = 3\nimports = ["conf.d/*.toml"]\n' + V3 + "  enable_cdi = false\n", V3 + "  enable_cdi = true\n", None),
    # ... and merges key by key: an import about another key leaves the main file's enable_cdi alone
    ('version = 3\nimports = ["conf.d/*.toml"]\n' + V3 + "  enable_cdi = false\n", V3 + '  x = "y"\n',
     "{main} does not enable CDI (io.containerd.cri.v1.runtime.enable_cdi); run scv.gpu.container_toolkit"),
    # containerd 1.7: no file enables CDI, an import about another plugin does not decide it
    ('version = 2\nimports = ["conf.d/*.toml"]\n', '[plugins."io.containerd.internal.v1.opt"]\n  path = "/opt"\n',
     "{main} does not enable CDI (io.containerd.grpc.v1.cri.enable_cdi); run scv.gpu.container_toolkit"),
    # ... an import enables CDI; one that names the CRI section without it replaces the main file's
    ('version = 2\nimports = ["conf.d/*.toml"]\n', V2 + "  enable_cdi = true\n", None),
    ('version = 2\nimports = ["conf.d/*.toml"]\n' + V2 + "  enable_cdi = true\n",
     '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n  runtime_type = "io.containerd.runc.v2"\n',
     "{dropin} (imported by {main}) names the io.containerd.grpc.v1.cri section, which containerd 1.x takes whole in "
     "place of the main file's, and does not enable CDI in it (enable_cdi); set enable_cdi = true there"),
    ('version = 2\nimports = ["conf.d/*.toml"]\n' + V2 + "  enable_cdi = true\n", V2 + "  enable_cdi = false\n",
     "{dropin} (imported by {main}) turns CDI off (io.containerd.grpc.v1.cri.enable_cdi = false)"),
    # cdi_spec_dirs: a list in an import replaces the main file's
    ('version = 3\nimports = ["conf.d/*.toml"]\n', V3 + '  cdi_spec_dirs = ["/etc/cdi"]\n',
     "{dropin} (imported by {main}) sets cdi_spec_dirs to ['/etc/cdi'], without /var/run/cdi where the DRA driver "
     "writes its CDI specifications; add it there, then restart containerd"),
    ('version = 3\nimports = ["conf.d/*.toml"]\n' + V3 + '  cdi_spec_dirs = ["/etc/cdi"]\n',
     V3 + '  cdi_spec_dirs = ["/var/run/cdi"]\n', None),
    ('version = 2\nimports = ["conf.d/*.toml"]\n' + V2 + '  enable_cdi = true\n  cdi_spec_dirs = ["/etc/cdi"]\n',
     # containerd 1.x would run with the import's section (default dirs), 2.x with both merged (the main file's)
     V2 + "  enable_cdi = true\n", "{main} sets cdi_spec_dirs to ['/etc/cdi']"),
    ('version = 3\nimports = ["conf.d/*.toml"]\n' + V3 + '  cdi_spec_dirs = ["/etc/cdi"]\n', V3 + '  x = "y"\n',
     "{main} sets cdi_spec_dirs to ['/etc/cdi'], without /var/run/cdi where the DRA driver writes its CDI "
     "specifications; add it"),
])
def test_cdi_is_judged_on_the_configuration_containerd_runs_with(capsys, etc, main, imported, problem):
    main_path = etc("config.toml", main)
    dropin = etc("conf.d/50-site.toml", ("version = 2\n" if main.startswith("version = 2") else "version = 3\n") +
                 imported)
    found = judged(capsys, main_path)
    if problem is None:
        assert found == [], found
    else:
        (line,) = found
        assert line.startswith(problem.format(main=main_path, dropin=dropin)), line


def test_the_last_import_decides_in_name_order_and_nested_ones_count(capsys, etc):
    main = etc("config.toml", 'version = 3\nimports = ["conf.d/*.toml"]\n')
    etc("conf.d/10-on.toml", "version = 3\n" + V3 + "  enable_cdi = true\n")
    late = etc("conf.d/90-off.toml", "version = 3\n" + V3 + "  enable_cdi = false\n")
    (line,) = judged(capsys, main)
    assert line.startswith("%s (imported by %s) turns CDI off" % (late, main)), line
    late.rename(etc.root / "conf.d" / "05-off.toml")
    assert judged(capsys, main) == []
    # an import's own import, named relative to the importing file's folder, is merged after it
    nested = etc("vendor/cdi.toml", "version = 3\n" + V3 + '  cdi_spec_dirs = ["/opt/cdi"]\n')
    importer = etc("conf.d/10-on.toml",
                   'version = 3\nimports = ["../vendor/cdi.toml"]\n' + V3 + "  enable_cdi = true\n")
    (line,) = judged(capsys, main)
    assert line.startswith("%s (imported by %s) sets cdi_spec_dirs to ['/opt/cdi']" % (nested, importer)), line


def test_a_relative_import_is_taken_from_the_main_files_folder(capsys, etc, tmp_path, monkeypatch):
    main = etc("config.toml", 'version = 3\nimports = ["site.toml"]\n')
    site = etc("site.toml", "version = 3\n" + V3 + "  enable_cdi = false\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site.toml").write_text("version = 3\n")      # not this one
    (line,) = judged(capsys, main)
    assert line.startswith("%s (imported by %s) turns CDI off" % (site, main)), line


def test_an_import_that_cannot_be_read_or_parsed_is_its_own_refusal(capsys, etc):
    main = etc("config.toml", 'version = 3\nimports = ["conf.d/*.toml", "/nonexistent/scv-gpu/99-x.toml"]\n')
    etc("conf.d/10-ok.toml", "version = 3\n")
    code, result = read(capsys, main)
    assert code == 1 and result["failed"] and result["content"] == main.read_text()
    assert result["msg"].startswith("%s imports /nonexistent/scv-gpu/99-x.toml, which cannot be read (" % main)
    (line,) = judged(capsys, main)
    assert line.startswith("CDI cannot be checked: %s imports /nonexistent/scv-gpu/99-x.toml, which cannot be read "
                           "([Errno 2] No such file or directory" % main), line
    assert line.endswith("containerd would not start either")
    broken = etc("conf.d/20-broken.toml", "version = 3\n[plugins\n")
    main.write_text('version = 3\nimports = ["conf.d/*.toml"]\n')
    (line,) = judged(capsys, main)
    assert line.startswith("CDI cannot be checked: %s is not valid TOML" % broken), line


def test_a_missing_or_invalid_main_file_is_refused_as_before(capsys, etc):
    main = etc.root / "config.toml"
    code, result = read(capsys, main)
    assert code == 1 and result["content"] is None
    assert judged(capsys, main) == [
        "%s cannot be read (it does not exist); CDI in containerd cannot be checked (set dra_driver_containerd_config, "
        "or dra_driver_runtime: crio on CRI-O nodes)" % main]
    etc("config.toml", 'version = "3"\n')
    (line,) = judged(capsys, main)
    assert line.startswith('CDI cannot be checked: %s has version = "3", a string' % main), line
