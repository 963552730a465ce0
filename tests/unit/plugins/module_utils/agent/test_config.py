"""The agent's settings: flags over environment over file over defaults, each refusal naming its source."""

from __future__ import annotations

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.agent import config


def load(argv=(), environ=None):
    return config.load(vars(config.parser("test").parse_args(list(argv))), environ or {})


def test_defaults_when_nothing_is_given():
    settings = load(environ={"NODE_NAME": "gpu-1"})
    assert settings["default-interval"] == 1000 and settings["log-level"] == "INFO"
    assert settings["xid-actions"] == {} and settings["node-condition"] is True
    assert set(settings.sources.values()) == {"default"}


def test_a_flag_beats_the_environment_which_beats_the_file(tmp_path):
    path = tmp_path / "agent.yml"
    path.write_text("default-interval: 700\nwatch_timeout: 30\nlog-level: debug\nxid-actions: {79: none, 48: reboot}\n"
                    "node-condition: false\n")
    settings = load(["--config", str(path), "--watch-timeout", "60"],
                    {"SCV_GPU_AGENT_DEFAULT_INTERVAL": "900", "SCV_GPU_AGENT_XID_ACTIONS": "31=reset,43=reset"})
    assert settings["watch-timeout"] == 60 and settings.sources["watch-timeout"] == "flag --watch-timeout"
    assert settings["default-interval"] == 900
    assert settings.sources["default-interval"] == "environment SCV_GPU_AGENT_DEFAULT_INTERVAL"
    assert settings["xid-actions"] == {31: "reset", 43: "reset"}
    assert settings["log-level"] == "DEBUG" and settings.sources["log-level"] == "file %s" % path
    assert settings["node-condition"] is False
    assert "default-interval=900 (environment SCV_GPU_AGENT_DEFAULT_INTERVAL)" in settings.describe()


def test_the_file_can_come_from_the_environment_and_flags_keep_their_old_spelling(tmp_path):
    path = tmp_path / "agent.json"
    path.write_text('{"metrics-address": ":9400"}')
    settings = load(["--xid-action", "79=none", "--xid-action", "13=reset", "--no-node-condition"],
                    {"SCV_GPU_AGENT_CONFIG": str(path)})
    assert settings["metrics-address"] == "127.0.0.1:9400"
    assert settings["xid-actions"] == {79: "none", 13: "reset"} and settings["node-condition"] is False


@pytest.mark.parametrize("argv, environ, message", [
    (["--log-level", "verbose"], {}, "log-level from the flag --log-level: 'verbose' cannot be used: expected one of"),
    (["--metrics-address", "0.0.0.0"], {}, "metrics-address from the flag --metrics-address: '0.0.0.0' cannot be used"),
    (["--default-interval", "0"], {}, "default-interval from the flag --default-interval: '0' cannot be used: "
                                      "expected a number from 100 to 3600000"),
    (["--default-interval", "50"], {}, "'50' cannot be used: expected a number from 100 to 3600000"),
    (["--watch-timeout", "0"], {}, "watch-timeout from the flag --watch-timeout: '0' cannot be used: expected a "
                                   "number from 1 to 3600"),
    (["--counters-interval", "0.5"], {}, "'0.5' cannot be used: expected a number from 1 to 3600"),
    (["--pod-resources-interval", "0"], {}, "'0' cannot be used: expected a number from 1 to 3600"),
    (["--request-timeout", "3600"], {}, "'3600' cannot be used: expected a number from 0.1 to 300"),
    (["--api-qps", "0"], {}, "api-qps from the flag --api-qps: '0' cannot be used: expected a number from 0.1 to 1000"),
    ([], {"SCV_GPU_AGENT_API_BURST": "0.5"},
     "api-burst from the environment SCV_GPU_AGENT_API_BURST: '0.5' cannot be used"),
    (["--node-name", "GPU_7"], {}, "node-name from the flag --node-name: 'GPU_7' cannot be used: 'GPU_7' is not a "
                                   "Kubernetes node name"),
    ([], {"NODE_NAME": "node/7"}, "node-name from the default: 'node/7' cannot be used"),
    ([], {"SCV_GPU_AGENT_REQUEST_TIMEOUT": "0"}, "request-timeout from the environment "
                                                 "SCV_GPU_AGENT_REQUEST_TIMEOUT: '0' cannot be used"),
    ([], {"SCV_GPU_AGENT_XID_ACTIONS": "79=explode"}, "bad XID action '79=explode'"),
    ([], {"SCV_GPU_AGENT_NODE_CONDITION": "maybe"}, "expected true or false"),
])
def test_a_bad_setting_is_refused_naming_it_and_where_it_came_from(argv, environ, message):
    with pytest.raises(config.ConfigError) as refused:
        load(argv, environ)
    assert message in str(refused.value)


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "expected a mapping of settings, got list"),
    ("kubeconfig: [unclosed", "is not YAML"),
    ("intervall: 5", "unknown setting 'intervall'; known: kubeconfig, node-name"),
    ("xid-hold: -1", "xid-hold from the file"),
])
def test_a_bad_file_is_refused_naming_the_file(tmp_path, text, message):
    path = tmp_path / "agent.yml"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as refused:
        load(["--config", str(path)])
    assert message in str(refused.value) and str(path) in str(refused.value)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(config.ConfigError, match="cannot read the configuration file .*: No such file"):
        load(["--config", str(tmp_path / "absent.yml")])


def test_changed_names_what_differs_and_only_some_settings_reload():
    before, after = load([], {"NODE_NAME": "a"}), load(["--default-interval", "500"], {"NODE_NAME": "b"})
    assert before.changed(after) == ["node-name", "default-interval"]
    assert config.reloadable("default-interval") and not config.reloadable("node-name")


@pytest.mark.parametrize("content, message", [
    (b"log-level: \xff\xfeDEBUG\n", "is not UTF-8 text (byte 11: invalid start byte); write it as UTF-8"),
    (b"\x00\x01\x02", "is not YAML"),
], ids=["latin-1", "binary"])
def test_a_file_that_is_not_text_is_refused_naming_it(tmp_path, content, message):
    path = tmp_path / "agent.yml"
    path.write_bytes(content)
    with pytest.raises(config.ConfigError) as refused:
        load(["--config", str(path)])
    assert message in str(refused.value) and str(path) in str(refused.value)


@pytest.mark.parametrize("text, message", [
    ("kubeconfig: {path: /etc/k.conf}", "kubeconfig from the file %s: {'path': '/etc/k.conf'} cannot be used: "
                                        "expected a file path (or '' for none), got object"),
    ("pod-resources-socket: [/a, /b]", "expected a file path (or '' for none), got array"),
    ("taint-kubeconfig:", "taint-kubeconfig from the file %s: None cannot be used: expected a file path (or '' "
                          "for none), got null"),
    ("counters-file: 5", "counters-file from the file %s: 5 cannot be used: expected a file path"),
    ("log-level: {debug: true}", "log-level from the file %s: {'debug': True} cannot be used: expected one of DEBUG"),
    ("metrics-address: 9400", "metrics-address from the file %s: 9400 cannot be used: expected host:port"),
    ("node-name: [a]", "expected a Kubernetes node name, got array"),
])
def test_a_mapping_list_or_number_where_a_text_belongs_is_refused_not_read_as_a_name(tmp_path, text, message):
    path = tmp_path / "agent.yml"
    path.write_text(text + "\n")
    with pytest.raises(config.ConfigError) as refused:
        load(["--config", str(path)], {"NODE_NAME": "gpu-1"})
    assert message.replace("%s", str(path)) in str(refused.value)


def test_a_misspelt_environment_variable_is_refused_with_the_name_it_resembles():
    with pytest.raises(config.ConfigError) as refused:
        load([], {"NODE_NAME": "gpu-1", "SCV_GPU_AGENT_DEFAULT_INTERVALL": "500", "SCV_GPU_AGENT_LOGLEVEL": "DEBUG"})
    message = str(refused.value)
    assert ("the environment variable SCV_GPU_AGENT_DEFAULT_INTERVALL names no setting (did you mean "
            "SCV_GPU_AGENT_DEFAULT_INTERVAL?)") in message
    assert "SCV_GPU_AGENT_LOGLEVEL names no setting (did you mean SCV_GPU_AGENT_LOG_LEVEL?)" in message
    assert "known: SCV_GPU_AGENT_API_BURST" in message
    assert load([], {"NODE_NAME": "gpu-1", "SCV_GPU_AGENT_CONFIG": "", "SCV_GPU_AGENT_LOG_LEVEL": "debug"})[
        "log-level"] == "DEBUG"


@pytest.mark.parametrize("text, served, unknown", [
    ("", frozenset(), []),
    ("# only a comment\n\n", frozenset(), []),
    ("DCGM_FI_DEV_NOT_A_SERIES, gauge, made up.\n", frozenset(), ["DCGM_FI_DEV_NOT_A_SERIES"]),
    ("DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\nDCGM_FI_DEV_NOT_A_SERIES, gauge, made up.\n",
     frozenset({"DCGM_FI_DEV_GPU_TEMP"}), ["DCGM_FI_DEV_NOT_A_SERIES"]),
], ids=["empty", "comments", "unknown-only", "one-known"])
def test_a_counters_file_is_read_once_and_names_what_is_served_even_nothing(tmp_path, text, served, unknown):
    path = tmp_path / "counters.csv"
    path.write_text(text)
    settings = load(["--counters-file", str(path)], {"NODE_NAME": "gpu-1"})
    assert settings.counters == (served, unknown)
    assert load([], {"NODE_NAME": "gpu-1"}).counters is None


@pytest.mark.parametrize("content, message", [
    (b"DCGM_FI_DEV_GPU_TEMP, gauge, \xb0C\n", "is not UTF-8 text (byte 29: invalid start byte)"),
    (b"temperature\n", "line 1: 'temperature' is not 'DCGM_FI_..., gauge|counter|label, help text'"),
    (None, "No such file or directory"),
], ids=["latin-1", "not-csv", "missing"])
def test_a_counters_file_that_cannot_be_read_is_refused_naming_it(tmp_path, content, message):
    path = tmp_path / "counters.csv"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(config.ConfigError) as refused:
        load([], {"NODE_NAME": "gpu-1", "SCV_GPU_AGENT_COUNTERS_FILE": str(path)})
    assert ("counters-file from the environment SCV_GPU_AGENT_COUNTERS_FILE: %r cannot be used" % str(path)
            in str(refused.value)) and message in str(refused.value)
