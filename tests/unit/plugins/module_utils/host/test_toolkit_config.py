"""NVIDIA's runtime configuration edited key by key: the file plus the settings, or a refusal naming the file."""

from __future__ import annotations

import tomllib

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.host.toolkit_config import ToolkitConfigError, apply_settings

PATH = "/etc/nvidia-container-runtime/config.toml"
ISOLATE = {"accept-nvidia-visible-devices-envvar-when-unprivileged": False,
           "accept-nvidia-visible-devices-as-volume-mounts": True, "nvidia-container-runtime.mode": "cdi"}
SITE = """# the site's comment
#accept-nvidia-visible-devices-as-volume-mounts = false
accept-nvidia-visible-devices-envvar-when-unprivileged = true  # keep this note
swarm-resource = "DOCKER_RESOURCE_GPU"

[nvidia-container-cli]
root = "/run/nvidia/driver"
ldconfig = "@/sbin/ldconfig.real"

[nvidia-container-runtime]
debug = "/var/log/nvidia-container-runtime.log"
mode = "legacy"
runtimes = ["docker-runc", "runc", "crun"]

[nvidia-container-runtime.modes.cdi]
spec-dirs = ["/etc/cdi", "/var/run/cdi"]
"""


def test_the_result_is_the_file_plus_the_settings_with_every_comment_kept():
    text = apply_settings(SITE, PATH, ISOLATE)
    expected = tomllib.loads(SITE)
    expected.update({"accept-nvidia-visible-devices-envvar-when-unprivileged": False,
                     "accept-nvidia-visible-devices-as-volume-mounts": True})
    expected["nvidia-container-runtime"]["mode"] = "cdi"
    assert tomllib.loads(text) == expected
    for line in ("# the site's comment", "#accept-nvidia-visible-devices-as-volume-mounts = false",
                 "accept-nvidia-visible-devices-envvar-when-unprivileged = false  # keep this note"):
        assert line in text.splitlines()
    # the new top-level key goes before the first table, not into it
    assert text.index("accept-nvidia-visible-devices-as-volume-mounts = true") < text.index("[nvidia-container-cli]")
    assert apply_settings(text, PATH, ISOLATE) == text


@pytest.mark.parametrize("text", [None, "", "\n"])
def test_no_file_gets_the_settings_alone(text):
    assert tomllib.loads(apply_settings(text, PATH, ISOLATE)) == {
        "accept-nvidia-visible-devices-envvar-when-unprivileged": False,
        "accept-nvidia-visible-devices-as-volume-mounts": True, "nvidia-container-runtime": {"mode": "cdi"}}


def test_a_file_with_only_tables_gets_its_top_level_keys_above_them():
    text = apply_settings('[nvidia-container-runtime]\nmode = "auto"', PATH, ISOLATE)
    assert tomllib.loads(text)["accept-nvidia-visible-devices-as-volume-mounts"] is True
    assert text.startswith("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n")


@pytest.mark.parametrize("text, words", [
    ('nvidia-container-runtime.mode = "legacy"\n', "dotted key or an inline table"),
    ('nvidia-container-runtime = {mode = "legacy"}\n', "dotted key or an inline table"),
    ("accept-nvidia-visible-devices-envvar-when-unprivileged = \n", "is not valid TOML"),
    ('nvidia-container-runtime = "x"\n', "nvidia-container-runtime is not a table"),
])
def test_a_file_the_edit_cannot_follow_is_refused_naming_it(text, words):
    with pytest.raises(ToolkitConfigError) as raised:
        apply_settings(text, PATH, ISOLATE)
    assert PATH in str(raised.value) and words in str(raised.value)


@pytest.mark.parametrize("settings", [{"a": {"b": 1}}, {"a": [1]}, {"a..b": True}, {".a": True}])
def test_a_setting_of_no_toml_kind_or_path_is_refused(settings):
    with pytest.raises(ToolkitConfigError):
        apply_settings("", PATH, settings)


def test_the_read_back_refuses_an_edit_that_went_astray(monkeypatch):
    """The whole result is compared with the file plus the settings: an editor that put a key in the wrong table
    (or changed another) is caught before anything is written."""
    from ansible_collections.scv.gpu.plugins.module_utils.host import toolkit_config

    def astray(text, table, key, value):
        literal = "true" if value is True else "false" if value is False else '"%s"' % value
        return text + "\n[elsewhere]\n%s = %s\n" % (key, literal)

    monkeypatch.setattr(toolkit_config, "set_key", astray)
    with pytest.raises(ToolkitConfigError, match="would not give the file plus these settings"):
        apply_settings(SITE, PATH, {"accept-nvidia-visible-devices-envvar-when-unprivileged": False})
