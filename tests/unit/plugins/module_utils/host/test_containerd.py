"""containerd's config.toml edited as text: the runtime's settings, the key-by-key edit, imports.

tests/integration/test_containerd_runtime.py reads every result back with a real containerd; these
tests need none and pin each rule on its own.
"""

from __future__ import annotations

import tomllib

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.host.containerd import (
    ContainerdConfigError,
    add_runtime,
    config_version,
    desired_settings,
    effective_configs,
    import_chain,
    lookup,
    resolve_imports,
    set_key,
    table_header,
)

NVIDIA = "/usr/bin/nvidia-container-runtime"
V2 = ("plugins", "io.containerd.grpc.v1.cri", "containerd")
V3 = ("plugins", "io.containerd.cri.v1.runtime", "containerd")
RUNC_V2 = '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'


def cri(text, version=2):
    return lookup(tomllib.loads(text), V2 if version == 2 else V3)


@pytest.mark.parametrize("version", [2, 3])
def test_each_version_gets_its_own_cri_table(version):
    assert config_version({"version": version}, "c.toml") == version
    settings = desired_settings({}, version, NVIDIA, default_runtime=False)
    table = V2 if version == 2 else V3
    assert settings == [(table + ("runtimes", "nvidia"), "runtime_type", "io.containerd.runc.v2"),
                        (table + ("runtimes", "nvidia", "options"), "BinaryName", NVIDIA)]


@pytest.mark.parametrize("config, message", [
    ({}, "c.toml has config version (none);"),
    ({"version": 1}, "c.toml has config version 1;"),
    ({"version": 4}, "c.toml has config version 4;"),
    ({"version": True}, "c.toml has config version True;"),
    ({"version": " 3"}, 'c.toml has version = " 3", a string; containerd reads only an integer there: write version = 3'),
    ({"version": 2.0}, "c.toml has version = 2.0, a float; containerd refuses it and reads only an integer: write "
                       "version = 2;"),
    ({"version": 2.5}, "c.toml has version = 2.5; containerd reads only an integer (2 or 3)"),
])
def test_versions_containerd_would_not_read_are_refused(config, message):
    with pytest.raises(ContainerdConfigError) as error:
        config_version(config, "c.toml")
    assert message in str(error.value)


def test_lookup_follows_tables_only():
    config = {"a": {"b": {"c": 1}, "s": "text"}}
    assert lookup(config, ("a", "b", "c")) == 1
    assert lookup(config, ("a", "b", "missing")) is None
    assert lookup(config, ("a", "s", "c")) is None   # a string is not a table
    assert lookup(config, ()) == config


def test_headers_quote_only_the_keys_that_need_it():
    assert table_header(("plugins", "io.containerd.grpc.v1.cri", "x_y-1")) == '[plugins."io.containerd.grpc.v1.cri".x_y-1]'
    assert table_header(("plugins", "io.containerd.cri.v1.runtime"), literal=True) == "[plugins.'io.containerd.cri.v1.runtime']"
    assert table_header(("it's",), literal=True) == '["it\'s"]'   # a literal key cannot hold a quote


def test_systemd_cgroup_follows_runc_and_default_runtime_goes_both_ways():
    runc = {"plugins": {"io.containerd.grpc.v1.cri": {"containerd": {
        "default_runtime_name": "nvidia", "runtimes": {"runc": {"options": {"SystemdCgroup": False}}}}}}}
    settings = desired_settings(runc, 2, NVIDIA, default_runtime=False, enable_cdi=True)
    assert (V2 + ("runtimes", "nvidia", "options"), "SystemdCgroup", False) in settings
    assert (V2, "default_runtime_name", "runc") in settings          # nvidia was the default: runc again
    assert (V2[:-1], "enable_cdi", True) in settings
    assert (V2, "default_runtime_name", "nvidia") in desired_settings(runc, 2, NVIDIA, default_runtime=True)
    assert not [s for s in desired_settings({}, 2, NVIDIA, default_runtime=False) if s[1] in (
        "default_runtime_name", "SystemdCgroup", "enable_cdi")]    # nothing asked, nothing set


def test_a_key_is_rewritten_in_place_with_its_indentation_comment_and_line_ending():
    text = 'version = 2\r\n[a]\r\n    k = "old"   # why\r\n    z = 1\r\n[b]\r\n  k = 2\r\n'
    assert set_key(text, ("a",), "k", "new") == 'version = 2\r\n[a]\r\n    k = "new"   # why\r\n    z = 1\r\n[b]\r\n  k = 2\r\n'
    assert set_key(text, ("b",), "k", True) == text.replace("k = 2", "k = true")
    assert set_key("[a]\n  'k' = 1", ("a",), "k", False) == "[a]\n  k = false"   # quoted key, no final newline


def test_a_missing_key_goes_first_in_its_table_and_a_missing_table_at_the_end():
    text = "[a]\n  x = 1\n[b]\n  y = 2\n"
    assert set_key(text, ("b",), "k", "v") == '[a]\n  x = 1\n[b]\n  k = "v"\n  y = 2\n'
    assert set_key("  [a]\n", ("a",), "k", 1) == "  [a]\n    k = 1\n"
    assert set_key("x = 1", ("c", "d.e"), "k", 1) == 'x = 1\n\n[c."d.e"]\n  k = 1\n'
    assert set_key("x = 1\r\n", ("c",), "k", 1) == "x = 1\r\n\r\n[c]\r\n  k = 1\r\n"
    assert set_key("[p.'q.r']\n", ("s.t",), "k", 1) == "[p.'q.r']\n\n['s.t']\n  k = 1\n"   # the file's own style


def test_a_key_of_another_table_or_inside_a_string_is_not_taken():
    text = '[a]\n  x = 1\n[b]\n  k = 1\n'
    assert set_key(text, ("a",), "k", 5) == '[a]\n  k = 5\n  x = 1\n[b]\n  k = 1\n'
    text = '[a]\n  s = """\n  k = 1\n"""\n'
    assert tomllib.loads(set_key(text, ("a",), "k", 5)) == {"a": {"s": "  k = 1\n", "k": 5}}
    text = "[a]\n  s = '''\n[b]\n'''\n  k = 1\n"
    assert tomllib.loads(set_key(text, ("a",), "k", 5)) == {"a": {"s": "[b]\n", "k": 5}}
    text = '[a]\n  u = "# not a comment"\n  k = 1 # real\n'
    assert set_key(text, ("a",), "k", 2) == '[a]\n  u = "# not a comment"\n  k = 2 # real\n'
    text = '[a]\n  q = "x\\"y"\n  m = """a \\""" b"""\n  k = 1\n'
    assert tomllib.loads(set_key(text, ("a",), "k", 2))["a"] == {"q": 'x"y', "m": 'a """ b', "k": 2}


def test_a_table_header_is_read_with_every_kind_of_key():
    text = '[ plugins . "io.containerd.grpc.v1.cri" . \'containerd\' ]\n  default_runtime_name = "runc"\n'
    new = set_key(text, V2, "default_runtime_name", "nvidia")
    assert new.count("[") == 1 and cri(new)["default_runtime_name"] == "nvidia"
    escaped = '["a\\u0041"]\n  k = 1\n'
    assert set_key(escaped, ("aA",), "k", 2) == '["a\\u0041"]\n  k = 2\n'
    for not_a_header in ("[[a]]\n  k = 1\n", "[a b]\n  k = 1\n", "[a.]\n  k = 1\n"):
        assert set_key(not_a_header, ("a",), "k", 2).endswith("\n\n[a]\n  k = 2\n")


def test_the_runtime_is_added_and_nothing_else_changes():
    text = 'version = 2\nroot = "/var/lib/containerd"\n' + RUNC_V2 + "  SystemdCgroup = true\n"
    new, settings = add_runtime(text, "c.toml", NVIDIA, default_runtime=True)
    assert new.startswith(text)
    config = cri(new)
    assert config["default_runtime_name"] == "nvidia"
    assert config["runtimes"]["nvidia"] == {"runtime_type": "io.containerd.runc.v2",
                                            "options": {"BinaryName": NVIDIA, "SystemdCgroup": True}}
    assert len(settings) == 4
    assert add_runtime(new, "c.toml", NVIDIA, default_runtime=True) == (new, settings)   # a second run: no change


def test_an_edit_that_would_not_read_back_as_intended_is_refused():
    inline = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  runtimes = { runc = {} }\n'
    with pytest.raises(ContainerdConfigError, match="c.toml defines the CRI runtime tables in a form"):
        add_runtime(inline, "c.toml", NVIDIA, default_runtime=False)
    with pytest.raises(ContainerdConfigError, match="is not valid TOML"):
        add_runtime("version = 2\n[plugins\n", "c.toml", NVIDIA, default_runtime=False)


def test_imports_resolve_like_containerd(tmp_path):
    (tmp_path / "conf.d").mkdir()
    for name in ("b.toml", "a.toml", "c.txt"):
        (tmp_path / "conf.d" / name).write_text("")
    path = str(tmp_path / "config.toml")
    assert resolve_imports(path, ["conf.d/*.toml", "/etc/x.toml", "rel.toml", 7]) == [
        str(tmp_path / "conf.d" / "a.toml"), str(tmp_path / "conf.d" / "b.toml"), "/etc/x.toml", str(tmp_path / "rel.toml")]
    assert resolve_imports(path, "conf.d/*.toml") == []
    assert resolve_imports(path, [str(tmp_path / "none" / "*.toml")], version=2) == []


def test_a_relative_glob_of_a_version_2_file_also_matches_from_the_root(tmp_path):
    """containerd 1.6 expanded it from its working directory, / under systemd."""
    absolute = list(resolve_imports(str(tmp_path / "config.toml"), ["etc/host*"], version=2))
    assert "/etc/hostname" in absolute or "/etc/hosts" in absolute
    assert resolve_imports(str(tmp_path / "config.toml"), ["etc/host*"], version=3) == []


def test_version_2_imports_are_read_both_as_containerd_1_6_replaces_and_as_1_7_merges():
    config = {"version": 2, "imports": ["/d/site.toml"], "plugins": {"cri": {"a": 1, "t": {"x": 1}}}}
    imported = 'version = 2\n[plugins.cri]\n  b = 2\n[plugins.cri.t]\n  y = 2\n[plugins.other]\n  c = 3\n'
    results = effective_configs(config, 2, "/etc/c.toml", read=lambda path: imported)
    assert results["replace"][0]["plugins"] == {"cri": {"b": 2, "t": {"y": 2}}, "other": {"c": 3}}
    assert results["merge"][0]["plugins"] == {"cri": {"a": 1, "b": 2, "t": {"x": 1, "y": 2}}, "other": {"c": 3}}
    assert results["merge"][1] == {"cri": "/d/site.toml", "other": "/d/site.toml"}
    assert list(effective_configs(config, 3, "/etc/c.toml", read=lambda path: imported)) == ["merge"]
    assert config["plugins"] == {"cri": {"a": 1, "t": {"x": 1}}}   # the main file's config is not changed


def test_an_import_that_cannot_be_read_is_named():
    def unreadable(path):
        raise OSError("permission denied")
    with pytest.raises(ContainerdConfigError, match="c.toml imports /d/x.toml, which cannot be read .permission "
                                                    "denied.; containerd would not start either; nothing was written$"):
        effective_configs({"imports": ["/d/x.toml"]}, 3, "c.toml", read=unreadable)
    with pytest.raises(ContainerdConfigError, match="/d/x.toml is not valid TOML: .*; fix it, the file was left "
                                                    "untouched$"):
        effective_configs({"imports": ["/d/x.toml"]}, 3, "c.toml", read=lambda path: "[")


def test_imports_are_followed_breadth_first_each_file_once_as_containerd_loads_them():
    files = {"/d/a.toml": 'imports = ["/d/c.toml", "/etc/c.toml"]\n[plugins.cri]\n  v = "a"\n',
             "/d/b.toml": '[plugins.cri]\n  v = "b"\n',
             "/d/c.toml": 'imports = ["/d/a.toml"]\n[plugins.cri]\n  v = "c"\n'}
    config = {"imports": ["/d/a.toml", "/d/b.toml"]}
    chain = import_chain(config, 3, "/etc/c.toml", read=files.__getitem__)
    assert [(entry["path"], entry["imported_by"]) for entry in chain] == [
        ("/d/a.toml", "/etc/c.toml"), ("/d/b.toml", "/etc/c.toml"), ("/d/c.toml", "/d/a.toml")]
    merged, sources = effective_configs(config, 3, "/etc/c.toml", read=files.__getitem__)["merge"]
    assert merged["plugins"]["cri"] == {"v": "c"} and sources == {"cri": "/d/c.toml"}
    assert effective_configs(config, 3, "/etc/c.toml", chain=chain[:2])["merge"][0]["plugins"]["cri"] == {"v": "b"}


def test_imports_that_hold_the_runtime_mean_no_edit_and_imports_that_override_it_are_named():
    holds = ('version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n'
             '  runtime_type = "io.containerd.runc.v2"\n'
             '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]\n  BinaryName = "%s"\n' % NVIDIA)
    text = 'version = 3\nimports = ["/d/nvidia.toml"]\n'
    assert add_runtime(text, "c.toml", NVIDIA, default_runtime=False, read=lambda path: holds)[0] == text
    overrides = 'version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd]\n  default_runtime_name = "runc"\n'
    with pytest.raises(ContainerdConfigError) as error:
        add_runtime(text, "c.toml", NVIDIA, default_runtime=True, read=lambda path: overrides)
    assert ('plugins."io.containerd.cri.v1.runtime".containerd.default_runtime_name would be "runc", '
            "from /d/nvidia.toml") in str(error.value)
    assert "1.6 replaces" not in str(error.value)
    text2 = 'version = 2\nimports = ["/d/cri.toml"]\n'
    replaces = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = false\n'
    with pytest.raises(ContainerdConfigError) as error:
        add_runtime(text2, "c.toml", NVIDIA, default_runtime=False, read=lambda path: replaces)
    assert "runtime_type would be unset, from /d/cri.toml (containerd 1.6 replaces the whole plugin section" \
        in str(error.value)


def test_brackets_in_the_first_key_and_in_arrays_spanning_lines_are_not_tables():
    text = ('"tag[" = 1\nversion = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  x = [\n    [1, 2],\n'
            '    ["runtimes"],\n  ]\n  default_runtime_name = "runc"\n')
    new, _settings = add_runtime(text, "c.toml", NVIDIA, default_runtime=True)
    assert new.count("default_runtime_name") == 1 and cri(new)["default_runtime_name"] == "nvidia"
    assert cri(new)["x"] == [[1, 2], ["runtimes"]] and tomllib.loads(new)["tag["] == 1


def test_strings_with_quotes_and_hashes_end_where_toml_ends_them():
    text = ('[a]\n  q = "a\\"#b" # c1\n  l = \'x#y\' # c2\n  s = """x\\"""" # c3\n  t = \'\'\'y\'\'\' # c4\n'
            '  k = 1 # c5\n')
    assert tomllib.loads(text)["a"] == {"q": 'a"#b', "l": "x#y", "s": 'x"', "t": "y", "k": 1}
    assert set_key(text, ("a",), "q", "z") == text.replace('"a\\"#b"', '"z"')
    assert set_key(text, ("a",), "l", "z") == text.replace("'x#y'", '"z"')
    assert set_key(text, ("a",), "k", 2) == text.replace("k = 1", "k = 2")


def test_a_comment_that_ends_the_file_is_kept():
    assert set_key("[a]\n  k = 1 # last", ("a",), "k", 2) == "[a]\n  k = 2 # last"


def test_an_empty_table_ends_at_the_next_header():
    assert set_key("[a]\n[b]\n  k = 1\n", ("a",), "k", 5) == "[a]\n  k = 5\n[b]\n  k = 1\n"


@pytest.mark.parametrize("text, newline", [
    ("x = 1\r\ny = 2\n", "\r\n"), ("x = 1\r\ny = 2\nz = 3\n", "\n"), ("x = 1\r\ny = 2\r\nz = 3\n", "\r\n")])
def test_a_new_table_takes_the_line_ending_most_lines_have(text, newline):
    assert set_key(text, ("c",), "k", 1) == text + "%s[c]%s  k = 1%s" % (newline, newline, newline)


def test_an_import_overrides_a_main_file_that_already_holds_the_runtime(tmp_path):
    """Nothing to edit in the main file is not enough: the import still wins, and the error names it."""
    dropin = tmp_path / "nvidia.toml"
    dropin.write_text('version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd]\n  default_runtime_name = "runc"\n')
    text = ('version = 3\nimports = ["%s"]\n[plugins."io.containerd.cri.v1.runtime".containerd]\n'
            '  default_runtime_name = "nvidia"\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n'
            '  runtime_type = "io.containerd.runc.v2"\n'
            '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]\n  BinaryName = "%s"\n'
            % (dropin, NVIDIA))
    with pytest.raises(ContainerdConfigError) as error:
        add_runtime(text, "c.toml", NVIDIA, default_runtime=True)   # the import is read from disk
    assert ('(they win): plugins."io.containerd.cri.v1.runtime".containerd.default_runtime_name would be "runc", '
            "from %s. Put the nvidia runtime in that import" % dropin) in str(error.value)


def test_a_comment_after_any_kind_of_string_is_kept_when_its_key_is_rewritten():
    text = '[a]\n  q = "a\\\\" # c1\n  s = """x""" # c2\n  t = \'\'\'y\'\'\' # c3\n'
    assert tomllib.loads(text)["a"] == {"q": "a\\", "s": "x", "t": "y"}
    for key, written in (("q", '"a\\\\"'), ("s", '"""x"""'), ("t", "'''y'''")):
        assert set_key(text, ("a",), key, "z") == text.replace(written, '"z"')


def test_keys_after_multi_line_strings_that_open_and_close_at_line_ends_are_found():
    for quotes in ('"""', "'''"):
        text = '[a]\n  s = %s\n  x\n  %s\n  k = 1 # c\n  m = %s%s # d\n  n = 1\n' % (quotes, quotes, quotes, quotes)
        assert set_key(text, ("a",), "k", 2) == text.replace("k = 1", "k = 2")
        assert set_key(text, ("a",), "n", 2) == text.replace("n = 1", "n = 2")


RUNC_OPTIONS = ('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n'
                '  Note = %s\n')
LOOKS_LIKE_CRI = '[plugins."io.containerd.grpc.v1.cri".containerd]'
LOOKS_LIKE_NVIDIA = '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]'


@pytest.mark.parametrize("value", [
    '"""\\\n\\\n%s\n\'\'\'x"""' % LOOKS_LIKE_CRI,                   # line continuations, then the other delimiter
    '"""\\\ndefault_runtime_name = "x"\n\\\n%s\n\' x"""' % LOOKS_LIKE_CRI,
    '"""\n"\\\n\\\n%s\n\\"""\'\'\'"""' % LOOKS_LIKE_NVIDIA,           # an escaped delimiter among them
    "'''''''#''''''",                                                # two quotes of the body before each end
    '"""a""""\n%s\nRoot = "/evil"\n# """""' % LOOKS_LIKE_NVIDIA,     # a quote run of 4 ends the string
    "'''x\\\n%s\nRoot = '/evil'\n'''" % LOOKS_LIKE_NVIDIA,           # a literal string's backslash is a character
], ids=["continuation", "continuation-key", "escaped-delimiter", "quote-runs", "four-quotes", "literal-backslash"])
@pytest.mark.parametrize("head", ['version = 2\n%s\n  default_runtime_name = "runc"\n' % LOOKS_LIKE_CRI, "version = 2\n"],
                         ids=["cri-table-first", "no-cri-table"])
def test_a_multi_line_string_of_any_form_stays_one_value_and_the_runtime_is_added(value, head):
    """Python's TOML parser is the judge: what it reads from the edited file is what it read before, plus
    exactly the nvidia runtime's keys; no line of the string is taken for a header or a key."""
    text = head + RUNC_OPTIONS % value
    before = tomllib.loads(text)
    new, _settings = add_runtime(text, "config.toml", NVIDIA, True)
    expected = before["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    expected["default_runtime_name"] = "nvidia"   # a key the file may not have had
    nvidia = expected["runtimes"].setdefault("nvidia", {})
    nvidia["runtime_type"] = "io.containerd.runc.v2"
    nvidia.setdefault("options", {}).update({"BinaryName": NVIDIA, "SystemdCgroup": True})
    assert tomllib.loads(new) == before


def test_an_edit_whose_read_back_is_not_the_old_document_plus_our_keys_is_refused(monkeypatch):
    """Whatever way an edit goes wrong (a string's body read as a table or a key, a key lost), the whole
    document read back must be the old one plus exactly the keys the module owns."""
    from ansible_collections.scv.gpu.plugins.module_utils.host import containerd
    text = ('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
            '  runtime_type = "io.containerd.runc.v2"\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n')
    honest = containerd.set_key

    def careless(text, table, key, value):        # as a line read from a string's body would: runc gains a key
        edited = honest(text, table, key, value)
        return edited if "Root" in edited else edited.replace("  SystemdCgroup = true\n",
                                                              "  SystemdCgroup = true\n  Root = \"/x\"\n", 1)
    monkeypatch.setattr(containerd, "set_key", careless)
    with pytest.raises(containerd.ContainerdConfigError,
                       match=r"editing would change plugins\.io\.containerd\.grpc\.v1\.cri\.containerd\.runtimes\.runc"
                             r"\.options\.Root, which this module does not own .*nothing was written"):
        containerd.add_runtime(text, "/etc/containerd/config.toml", "/usr/bin/nvidia-container-runtime", False)

    def lossy(text, table, key, value):            # or a key of the site's is lost
        edited = honest(text, table, key, value)
        return edited.replace("  SystemdCgroup = true\n", "", 1) if key == "SystemdCgroup" else edited
    monkeypatch.setattr(containerd, "set_key", lossy)
    with pytest.raises(containerd.ContainerdConfigError, match=r"runc\.options\.SystemdCgroup, which this module"):
        containerd.add_runtime(text, "/etc/containerd/config.toml", "/usr/bin/nvidia-container-runtime", False)


def test_first_difference_names_the_key_path():
    from ansible_collections.scv.gpu.plugins.module_utils.host.containerd import _first_difference
    assert _first_difference({"a": {"b": 1}}, {"a": {"b": 1}}) is None
    assert _first_difference({"a": {"b": 1}}, {"a": {"b": 2}}) == "a.b"
    assert _first_difference({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}) == "a.c"
    assert _first_difference({"a": True}, {"a": 1}) == "a"


V3_RUNTIMES = 'plugins."io.containerd.cri.v1.runtime".containerd.runtimes'


def _nvidia_settings(settings):
    return {key: value for table, key, value in settings if "nvidia" in table}


def test_the_nvidia_runtime_shares_the_default_runtimes_cgroup_driver_and_base_spec():
    """crun the default, with systemd cgroups and a base OCI spec: the nvidia runtime takes both, not runc's."""
    from ansible_collections.scv.gpu.plugins.module_utils.host.containerd import add_runtime
    text = ('version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd]\n  default_runtime_name = "crun"\n'
            '[%s.crun]\n  runtime_type = "io.containerd.runc.v2"\n  base_runtime_spec = "/etc/containerd/base.json"\n'
            '[%s.crun.options]\n  BinaryName = "/usr/bin/crun"\n  SystemdCgroup = true\n  Root = "/run/crun"\n'
            % (V3_RUNTIMES, V3_RUNTIMES))
    new_text, settings = add_runtime(text, "/etc/containerd/config.toml", "/usr/bin/nvidia-container-runtime", False)
    assert _nvidia_settings(settings) == {"runtime_type": "io.containerd.runc.v2",
                                          "BinaryName": "/usr/bin/nvidia-container-runtime", "SystemdCgroup": True,
                                          "base_runtime_spec": "/etc/containerd/base.json"}
    nvidia = tomllib.loads(new_text)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["nvidia"]
    assert "Root" not in nvidia["options"] and nvidia["base_runtime_spec"] == "/etc/containerd/base.json"


def test_runcs_cgroup_driver_set_only_in_an_import_reaches_the_nvidia_runtime():
    """Version 3: the main file imports a drop-in that sets runc's SystemdCgroup; containerd merges it in."""
    from ansible_collections.scv.gpu.plugins.module_utils.host.containerd import add_runtime
    main = 'version = 3\nimports = ["/etc/containerd/conf.d/10-runc.toml"]\n'
    imported = 'version = 3\n[%s.runc.options]\n  SystemdCgroup = true\n' % V3_RUNTIMES
    _text, settings = add_runtime(main, "/etc/containerd/config.toml", "/usr/bin/nvidia-container-runtime", False,
                                  read=lambda path: imported)
    assert _nvidia_settings(settings)["SystemdCgroup"] is True


def test_where_nvidia_is_already_the_default_it_takes_runcs_settings_again_not_its_own():
    """A rerun: nvidia is the default with a stale SystemdCgroup of its own; runc's (true) is the one to share. An
    empty base_runtime_spec is none."""
    from ansible_collections.scv.gpu.plugins.module_utils.host.containerd import add_runtime
    text = ('version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd]\n  default_runtime_name = "nvidia"\n'
            '[%s.runc]\n  runtime_type = "io.containerd.runc.v2"\n  base_runtime_spec = ""\n'
            '[%s.runc.options]\n  SystemdCgroup = true\n'
            '[%s.nvidia]\n  runtime_type = "io.containerd.runc.v2"\n'
            '[%s.nvidia.options]\n  BinaryName = "/usr/bin/nvidia-container-runtime"\n  SystemdCgroup = false\n'
            % ((V3_RUNTIMES,) * 4))
    _text, settings = add_runtime(text, "/etc/containerd/config.toml", "/usr/bin/nvidia-container-runtime", True)
    assert _nvidia_settings(settings)["SystemdCgroup"] is True
    assert "base_runtime_spec" not in _nvidia_settings(settings)


def test_first_difference_between_a_table_and_a_value():
    from ansible_collections.scv.gpu.plugins.module_utils.host.containerd import _first_difference
    assert _first_difference({"a": {"b": 1}}, {"a": 1}) == "a"
    assert _first_difference({"a": 1}, {"a": {"b": 1}}) == "a"
