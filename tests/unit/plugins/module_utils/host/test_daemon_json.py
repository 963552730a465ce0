"""The daemon.json merge: properties over random documents (hypothesis), and the edge cases."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import assume, given, settings, strategies as st

from ansible_collections.scv.gpu.plugins.module_utils.host.daemon_json import (
    DaemonJsonError,
    canonical,
    conflicts,
    dockerd_flags,
    merge,
    parse,
    render,
)
from ansible_collections.scv.gpu.plugins.module_utils.host.systemd import unit_files

RUNTIME = "/usr/bin/nvidia-container-runtime"

# Keys Docker users really have, plus arbitrary ones; values are any JSON.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
known_keys = st.sampled_from(["features", "log-driver", "log-opts", "exec-opts", "storage-driver", "data-root",
                              "registry-mirrors", "insecure-registries", "runtimes", "default-runtime", "hosts"])
keys = known_keys | st.text(min_size=1, max_size=10)
other_runtimes = st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda name: name != "nvidia"),
                                 st.dictionaries(st.text(max_size=8), json_values, max_size=3), max_size=3)


@st.composite
def daemon_json(draw):
    document = draw(st.dictionaries(keys, json_values, max_size=8))
    if draw(st.booleans()):
        runtimes = draw(other_runtimes)
        if draw(st.booleans()):
            runtimes["nvidia"] = draw(st.dictionaries(st.text(max_size=8), json_values, max_size=3))
        document["runtimes"] = runtimes
    return document


OWNED = {"runtimes", "default-runtime"}


@settings(max_examples=300, deadline=None)
@given(document=daemon_json(), default_runtime=st.sampled_from([True, False, None]))
def test_no_foreign_key_is_lost_or_altered(document, default_runtime):
    if document.get("runtimes") is not None and not isinstance(document["runtimes"], dict):
        with pytest.raises(DaemonJsonError):   # Docker would not start with it either
            merge(document, RUNTIME, [], default_runtime, {})
        return
    before = json.loads(json.dumps(document))
    merged = merge(document, RUNTIME, [], default_runtime, {})
    assert document == before, "merge must not change its input"
    for key, value in document.items():
        if key not in OWNED:
            assert merged[key] == value
    for name, runtime in (document.get("runtimes") or {}).items():
        if name != "nvidia":
            assert merged["runtimes"][name] == runtime
    assert merged["runtimes"]["nvidia"]["path"] == RUNTIME
    assert merged["runtimes"]["nvidia"]["runtimeArgs"] == []
    if default_runtime is True:
        assert merged["default-runtime"] == "nvidia"
    elif "default-runtime" in document and document["default-runtime"] != "nvidia":
        assert merged["default-runtime"] == document["default-runtime"]
    # nothing is added but the runtime and the default
    assert set(merged) <= set(document) | OWNED


@settings(max_examples=300, deadline=None)
@given(document=daemon_json(), extra=st.dictionaries(keys, json_values, max_size=4),
       default_runtime=st.sampled_from([True, False, None]))
def test_merging_twice_equals_merging_once(document, extra, default_runtime):
    try:
        once = merge(document, RUNTIME, ["--debug"], default_runtime, extra)
    except DaemonJsonError:
        return
    assert merge(once, RUNTIME, ["--debug"], default_runtime, extra) == once


@settings(max_examples=200, deadline=None)
@given(document=daemon_json())
def test_render_then_parse_round_trips(document):
    assert parse(render(document), "daemon.json") == document


@settings(max_examples=200, deadline=None)
@given(document=daemon_json(), extra=st.dictionaries(known_keys, json_values, max_size=3))
def test_settings_merge_objects_and_replace_the_rest(document, extra):
    extra.pop("runtimes", None)
    extra.pop("default-runtime", None)
    assume(document.get("runtimes") is None or isinstance(document["runtimes"], dict))
    merged = merge(document, RUNTIME, [], None, extra)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(document.get(key), dict):
            for inner, inner_value in document[key].items():
                if inner not in value:
                    assert merged[key][inner] == inner_value
        else:
            assert merged[key] == value


SEED = {   # the daemon.json the seeds ask for, beside unrelated keys
    "exec-opts": ["native.cgroupdriver=systemd"],
    "log-driver": "json-file",
    "log-opts": {"max-size": "100m"},
    "storage-driver": "overlay2",
    "registry-mirrors": ["https://mirror.example.com"],
    "insecure-registries": ["registry.example.com:5000"],
    "features": {"buildkit": True, "containerd-snapshotter": False},
    "runtimes": {"crun": {"path": "/usr/bin/crun"}},
    "custom-key": {"nested": [1, 2, {"deep": None}]},
}


def test_seed_settings_survive():
    merged = merge(SEED, RUNTIME, [], True, {})
    assert merged == dict(SEED, runtimes={"crun": {"path": "/usr/bin/crun"},
                                          "nvidia": {"path": RUNTIME, "runtimeArgs": []}},
                          **{"default-runtime": "nvidia"})


def test_default_runtime_false_removes_only_nvidia():
    assert "default-runtime" not in merge({"default-runtime": "nvidia"}, RUNTIME, [], False, {})
    assert merge({"default-runtime": "crun"}, RUNTIME, [], False, {})["default-runtime"] == "crun"


def test_settings_merge_log_opts_key_by_key():
    merged = merge({"log-opts": {"max-size": "10m", "max-file": "3"}}, RUNTIME, [], None,
                   {"log-opts": {"max-size": "100m"}, "registry-mirrors": ["https://b"]})
    assert merged["log-opts"] == {"max-size": "100m", "max-file": "3"}
    assert merged["registry-mirrors"] == ["https://b"]


# As dockerd reads them (tests/integration/test_docker_daemon_dockerd.py asks dockerd itself): white
# space around the document, Unicode's included, a byte order mark at the start, a top-level null.
@pytest.mark.parametrize("text", ["", "   \n", "{}", "\x0b\u3000", "\ufeff", "\ufeff {}", "null", " \x85null\n",
                                  "\ufeffnull"])
def test_empty_is_an_empty_object(text):
    assert parse(text, "/etc/docker/daemon.json") == {}


@pytest.mark.parametrize("text", ["\x1c", " \ufeff{}", '{\x0b"debug": true}'])
def test_what_dockerd_does_not_trim_is_invalid(text):
    with pytest.raises(DaemonJsonError, match="is not valid JSON"):
        parse(text, "/etc/docker/daemon.json")


def test_positions_count_the_trimmed_white_space():
    with pytest.raises(DaemonJsonError) as error:
        parse('\ufeff\n\x0b{\n  "debug": tru\n}', "/etc/docker/daemon.json")
    assert "at line 3, column 12" in str(error.value)


def test_invalid_json_names_file_and_position():
    with pytest.raises(DaemonJsonError) as error:
        parse('{\n  "log-driver": "json-file",\n  "debug": tru\n}', "/etc/docker/daemon.json")
    assert str(error.value).startswith("/etc/docker/daemon.json is not valid JSON: Expecting value at line 3, "
                                       "column 12")
    assert "left untouched" in str(error.value)


@pytest.mark.parametrize("text, kind", [("[1, 2]", "array"), ('"nvidia"', "string"), ("3", "number"),
                                        ("true", "boolean")])
def test_non_object_is_refused(text, kind):
    with pytest.raises(DaemonJsonError) as error:
        parse(text, "/etc/docker/daemon.json")
    assert "holds a JSON %s at the top level" % kind in str(error.value)


def test_duplicate_key_is_refused():
    with pytest.raises(DaemonJsonError) as error:
        parse('{"debug": true, "debug": false}', "/x/daemon.json")
    assert str(error.value).startswith('/x/daemon.json: the key "debug" appears more than once')
    assert "dockerd starts with it and uses one of the values" in str(error.value)


def test_render_keeps_indentation_and_order():
    previous = '{\n  "b": 1,\n  "a": {\n    "x": 2\n  }\n}\n'
    merged = merge(parse(previous, "f"), RUNTIME, [], True, {})
    text = render(merged, previous)
    assert text.startswith('{\n  "b": 1,\n  "a": {\n    "x": 2\n  },\n  "runtimes"')
    assert list(json.loads(text)) == ["b", "a", "runtimes", "default-runtime"]


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def test_flags_come_from_the_effective_exec_start(tmp_path):
    lib, etc = str(tmp_path / "lib"), str(tmp_path / "etc")
    env = str(tmp_path / "default-docker")
    write(env, 'DOCKER_OPTS="--default-runtime=runc --log-opt max-size=1m"\n')
    write(os.path.join(lib, "docker.service"),
          "[Unit]\nDescription=Docker\n[Service]\nEnvironmentFile=-%s\n"
          "ExecStart=/usr/sbin/dockerd -H fd:// $DOCKER_OPTS\n" % env)
    files = unit_files("docker.service", [etc, lib])
    flags = dockerd_flags(files)
    assert set(flags) == {"hosts", "default-runtime", "log-opts"}
    assert flags["default-runtime"] == "%s: --default-runtime" % files[0]
    assert conflicts({"default-runtime": "nvidia", "debug": True}, flags) == [
        ("default-runtime", "%s: --default-runtime" % files[0])]

    # a drop-in that resets ExecStart replaces the command line
    write(os.path.join(etc, "docker.service.d", "10-plain.conf"),
          "[Service]\nExecStart=\nExecStart=/usr/sbin/dockerd \\\n  --containerd=/run/containerd/containerd.sock\n")
    files = unit_files("docker.service", [etc, lib])
    assert files == [os.path.join(lib, "docker.service"), os.path.join(etc, "docker.service.d", "10-plain.conf")]
    assert set(dockerd_flags(files)) == {"containerd"}


def test_no_unit_no_flags(tmp_path):
    assert unit_files("docker.service", [str(tmp_path)]) == []
    assert dockerd_flags([]) == {}


# ------------------------------------------------------------ hostile and unlucky input

@pytest.mark.parametrize("text, literal, line, column", [
    ('{"shutdown-timeout": 1e400}', "1e400", 1, 22),
    ('{\n  "mtu": NaN\n}', "NaN", 2, 10),
    ('{"a": "Infinity",\n "b": [1, -Infinity]}', "-Infinity", 2, 11),
    ('{"runtimes": {"r": {"options": {"a": %s}}}}' % ("9" * 309), "9" * 309, 1, 38),
    ('{"a": -%s}' % ("1" * 5000), "-" + "1" * 5000, 1, 7),      # beyond int()'s 4300 digits too
    ('{"x": "1e400", "y": 1e400}', "1e400", 1, 21),    # the string is not the number
])
def test_numbers_json_cannot_hold_are_refused_with_line_and_column(text, literal, line, column):
    with pytest.raises(DaemonJsonError) as error:
        parse(text, "/etc/docker/daemon.json")
    assert str(error.value).startswith("/etc/docker/daemon.json: %s at line %d, column %d is not a number "
                                       "dockerd can read" % (literal[:40], line, column))


def test_a_bad_number_after_a_leading_blank_line_is_placed_on_its_own_line():
    with pytest.raises(DaemonJsonError, match="1e400 at line 2, column 7 is not a number"):
        parse('\n{"a": 1e400}', "/etc/docker/daemon.json")


@pytest.mark.parametrize("literal", ["123456789012345678901234567890", "9" * 308, "-18446744073709551616", "1e308"])
def test_numbers_beyond_64_bit_integers_are_read_as_dockerd_reads_them(literal):
    # dockerd reads a number it has no type for as a 64-bit float: these are finite, it starts.
    text = '{"runtimes": {"r": {"path": "/r", "options": {"Big": %s}}}}' % literal
    document = parse(text, "/etc/docker/daemon.json")
    assert json.dumps(document["runtimes"]["r"]["options"]["Big"]) in (literal, "1e+308")
    assert render(document).count(literal if literal != "1e308" else "1e+308") == 1


@pytest.mark.parametrize("levels", [501, 990, 5000, 100000])
def test_deep_nesting_is_refused_not_a_recursion_error(levels):
    text = '{"a": ' + "[" * levels + "]" * levels + "}"
    with pytest.raises(DaemonJsonError, match="nests arrays or objects"):
        parse(text, "/etc/docker/daemon.json")


def test_nesting_within_the_limit_is_merged():
    nested = json.loads('{"a": ' + "[" * 499 + "]" * 499 + "}")
    assert parse(json.dumps(nested), "f") == nested


def test_the_nesting_limit_is_exact():
    """500 levels (the object and 499 arrays) are read; one more is refused, and the message says 500."""
    assert parse('{"a": ' + "[" * 499 + "]" * 499 + "}", "f")
    with pytest.raises(DaemonJsonError, match="f nests arrays or objects more than 500 levels deep"):
        parse('{"a": ' + "[" * 500 + "]" * 500 + "}", "f")


@pytest.mark.parametrize("escaped", ["\\udc80", "\\ud800", "a\\udfffb", "\\ud83d\\ude00"])
def test_lone_surrogates_round_trip_as_escapes(escaped):
    document = parse('{"labels": ["%s"]}' % escaped, "f")
    text = render(merge(document, RUNTIME, [], True, {}))
    text.encode("utf-8")                          # writable as UTF-8
    assert parse(text, "f")["labels"] == document["labels"]
    if escaped == "\\ud83d\\ude00":               # a real pair is a character, written as itself
        assert "\U0001F600" in text


@pytest.mark.parametrize("on_disk, requested", [(1, True), (0, False), (1.0, 1), (True, 1), (1, 1.0)])
def test_values_compare_as_json_not_as_python(on_disk, requested):
    document = {"debug": on_disk}
    merged = merge(document, RUNTIME, [], None, {"debug": requested})
    assert merged["debug"] == requested and type(merged["debug"]) is type(requested)
    assert canonical(merged["debug"]) != canonical(on_disk)


def test_add_runtime_flags_merge_with_the_files_runtimes(tmp_path):
    lib = str(tmp_path / "lib")
    write(os.path.join(lib, "docker.service"),
          "[Service]\nExecStart=/usr/bin/dockerd --add-runtime crun=/usr/bin/crun --add-runtime=youki=/usr/bin/youki\n")
    flags = dockerd_flags(unit_files("docker.service", [lib]))
    document = {"runtimes": {"nvidia": {"path": RUNTIME}, "runsc": {"path": "/usr/bin/runsc"}}}
    assert conflicts(document, flags) == []
    document["runtimes"]["youki"] = {"path": "/usr/local/bin/youki"}
    assert conflicts(document, flags) == [("runtimes.youki", "%s: --add-runtime" % os.path.join(lib, "docker.service"))]


@pytest.mark.parametrize("default_runtime, settings, message", [
    (True, {"default-runtime": "runc"}, 'settings sets default-runtime to "runc", but default_runtime is true'),
    (False, {"default-runtime": "nvidia"}, "settings sets default-runtime to nvidia, but default_runtime is false"),
    (True, {"runtimes": {"nvidia": {"path": "/opt/nvidia-container-runtime"}}},
     'settings sets runtimes.nvidia.path to "/opt/nvidia-container-runtime", but runtime_path is'),
    (None, {"runtimes": {"nvidia": {"runtimeArgs": ["--debug"]}}},
     'settings sets runtimes.nvidia.runtimeArgs to ["--debug"], but runtime_args is []'),
])
def test_settings_that_contradict_the_options_are_errors(default_runtime, settings, message):
    with pytest.raises(DaemonJsonError) as error:
        merge({}, RUNTIME, [], default_runtime, settings)
    assert message in str(error.value) and "nothing was written" in str(error.value)


def test_settings_that_agree_with_the_options_are_fine():
    merged = merge({}, RUNTIME, [], None, {"default-runtime": "runc", "runtimes": {"nvidia": {"path": RUNTIME}}})
    assert merged["default-runtime"] == "runc"


def test_canonical_texts_ignore_key_order_but_not_json_types():
    assert canonical({"a": 1, "b": {"c": [1, 2], "d": None}}) == canonical({"b": {"d": None, "c": [1, 2]}, "a": 1})
    assert canonical([1, 2]) != canonical([2, 1])
    assert len({canonical(1), canonical(True), canonical(1.0)}) == 3


@pytest.mark.parametrize("default_runtime, wanted", [(False, "runc"), (None, "nvidia"), (None, "runc")])
def test_a_default_runtime_the_options_leave_open_is_the_settings_choice(default_runtime, wanted):
    merged = merge({}, RUNTIME, [], default_runtime, {"default-runtime": wanted})
    assert merged["default-runtime"] == wanted


def test_flags_read_environment_assignments_and_a_runtime_given_as_the_next_word(tmp_path):
    unit = tmp_path / "docker.service"
    unit.write_text('[Service]\nEnvironment="NOTANASSIGNMENT" "OPTS=--data-root=/d"\n'
                    "ExecStart=/usr/sbin/dockerd $OPTS --add-runtime youki=/usr/bin/youki -H fd://\n")
    flags = dockerd_flags([str(unit)])
    assert flags == {"data-root": "%s: --data-root" % unit, "runtimes.youki": "%s: --add-runtime" % unit,
                     "hosts": "%s: -H" % unit}


@pytest.mark.parametrize("previous, indent", [("", "    "), ('{\n  "a": 0\n}\n', "  "), ('{\n\t"a": 0\n}\n', "\t")])
def test_render_takes_the_indentation_of_the_previous_text(previous, indent):
    assert render({"a": 1}, previous) == '{\n%s"a": 1\n}\n' % indent


@pytest.mark.parametrize("rc, output, verdict", [
    (0, "", (True, None)),
    (124, "", (None, "dockerd --validate did not finish within the time allowed")),
    (1, "", (False, "dockerd --validate failed (exit status 1) and printed nothing")),
    (1, "unable to configure the Docker daemon with file /tmp/x.json: bad key", (False, "bad key")),
])
def test_what_dockerd_validate_said(rc, output, verdict):
    from ansible_collections.scv.gpu.plugins.module_utils.host.daemon_json import validation_verdict
    assert validation_verdict(rc, output) == verdict


def test_a_flag_with_a_value_object_conflicts_as_a_whole_and_a_trailing_add_runtime_is_read(tmp_path):
    assert conflicts({"log-opts": {"max-size": "1m"}, "runtimes": {"log-opts": {}}}, {"log-opts": "u: --log-opt"}) == [
        ("log-opts", "u: --log-opt")]
    unit = tmp_path / "docker.service"
    unit.write_text("[Service]\nExecStart=/usr/sbin/dockerd --add-runtime\n")
    assert dockerd_flags([str(unit)]) == {"runtimes.": "%s: --add-runtime" % unit}


def test_an_add_runtime_flag_with_its_value_as_the_last_word(tmp_path):
    unit = tmp_path / "docker.service"
    unit.write_text("[Service]\nExecStart=/usr/sbin/dockerd -H fd:// --add-runtime youki=/usr/bin/youki\n")
    assert set(dockerd_flags([str(unit)])) == {"hosts", "runtimes.youki"}
