"""docker_daemon_config judged by dockerd itself: `dockerd --validate --config-file FILE`.

tools/dockerd/build compiles dockerd and docker-proxy from github.com/moby/moby/v2 (pinned in
tools/dockerd/go.mod) once per pin. dockerd is the judge of every accept-or-refuse decision the
module makes on its own (how the file is read: white space, byte order mark, null, numbers,
syntax), and it is the checker the module runs before it writes (the settings' types, keys Docker
does not know). The two places where the module refuses what dockerd reads are asserted as such:
a key given twice in one object, and nesting beyond 500 levels.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ansible_collections.scv.gpu.plugins.module_utils.host.daemon_json import DaemonJsonError, merge, parse, render
from ansible_collections.scv.gpu.plugins.modules import docker_daemon_config
from harness.in_process import run_module
from harness.paths import ROOT

NVIDIA = "/usr/bin/nvidia-container-runtime"


@pytest.fixture(scope="session")
def dockerd_bin():
    done = subprocess.run([str(ROOT / "tools" / "dockerd" / "build")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    folder = pathlib.Path(done.stdout.strip().splitlines()[-1])
    version = subprocess.run([str(folder / "dockerd"), "--version"], capture_output=True, text=True, check=True)
    assert "v2.0.0" in version.stdout, version.stdout
    return folder


@pytest.fixture
def on_path(dockerd_bin, monkeypatch):
    """dockerd and docker-proxy on PATH, as a Docker Engine package installs them."""
    monkeypatch.setenv("PATH", "%s:%s" % (dockerd_bin, os.environ["PATH"]))
    return dockerd_bin


def judge(folder, data, tmp_path):
    """(accepted, reason) from dockerd --validate on the bytes ``data``."""
    path = tmp_path / "judged.json"
    path.write_bytes(data)
    done = subprocess.run([str(folder / "dockerd"), "--validate", "--config-file", str(path)], capture_output=True,
                          text=True, check=False, timeout=60,
                          env=dict(os.environ, PATH="%s:%s" % (folder, os.environ["PATH"])))
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def ours(text):
    """(accepted, message or the merged document) of the module's own reading and merge, no dockerd asked."""
    try:
        return True, merge(parse(text, "/etc/docker/daemon.json"), NVIDIA, [], True, {})
    except DaemonJsonError as error:
        return False, str(error)


# ------------------------------------------------------------- reading, one class at a time

OPTIONS = '{"runtimes": {"r": {"path": "/usr/bin/r", "options": %s}}}'
READING = {
    "empty file": "",
    "white space only, Unicode's too": " \n\t\x0b\u3000\u00a0\x85",
    "byte order mark, then an object": "\ufeff{}",
    "white space outside the object": "\x0b\n {\"debug\": true} \x0c",
    "top-level null": "null",
    "null after a byte order mark": "\ufeff null",
    "top-level array": "[]",
    "top-level string": '"x"',
    "top-level number": "3",
    "control character outside the object": "\x1c{}",
    "byte order mark after white space": " \ufeff{}",
    "vertical tab between tokens": '{\x0b"debug": true}',
    "trailing comma": '{"debug": true,}',
    "comment": '{/* no */}',
    "two documents": "{}{}",
    "NaN": OPTIONS % '{"a": NaN}',
    "Infinity": OPTIONS % '{"a": -Infinity}',
    "1e400": OPTIONS % '{"a": 1e400}',
    "1e308": OPTIONS % '{"a": 1e308}',
    "an integer beyond 64 bits": OPTIONS % '{"a": 123456789012345678901234567890}',
    "an integer of 309 digits": OPTIONS % ('{"a": %s}' % ("9" * 309)),
    "an integer of 308 digits": OPTIONS % ('{"a": %s}' % ("9" * 308)),
    "a lone surrogate escape": '{"data-root": "/var/lib/\\ud800"}',
    "a raw control character in a string": '{"data-root": "/a\x01b"}',
    "nesting 200 deep in runtime options": OPTIONS % ('{"a": %s}' % ("[" * 200 + "]" * 200)),
    "runtimes null": '{"runtimes": null}',
    "runtimes.nvidia null": '{"runtimes": {"nvidia": null}}',
    "runtimes.nvidia a string": '{"runtimes": {"nvidia": "x"}}',
    "runtimes.nvidia an array": '{"runtimes": {"nvidia": []}}',
}
DOCKERD_ONLY = {   # dockerd starts with these; the module refuses them, and says why
    "a key given twice": ('{"debug": true, "debug": false}', "appears more than once"),
    "a nested key given twice": (OPTIONS % '{"a": 1, "a": 2}', "appears more than once"),
    "nesting 600 deep": (OPTIONS % ('{"a": %s}' % ("[" * 600 + "]" * 600)), "more than 500 levels deep"),
}


@pytest.mark.parametrize("name", sorted(READING))
def test_the_module_reads_the_file_as_dockerd_does(dockerd_bin, tmp_path, name):
    text = READING[name]
    accepted, reason = judge(dockerd_bin, text.encode("utf-8"), tmp_path)
    read, result = ours(text)
    assert read == accepted, (name, reason, result)
    if read:
        # what the module writes, dockerd starts with too
        written = render(result, text).encode("utf-8")
        assert judge(dockerd_bin, written, tmp_path)[0], written[:300]


@pytest.mark.parametrize("name", sorted(DOCKERD_ONLY))
def test_the_two_refusals_of_what_dockerd_reads_say_why(dockerd_bin, tmp_path, name):
    text, message = DOCKERD_ONLY[name]
    assert judge(dockerd_bin, text.encode("utf-8"), tmp_path)[0]
    read, result = ours(text)
    assert not read and message in result


def test_invalid_utf8_is_refused_by_both(capsys, on_path, tmp_path):
    data = b'{"data-root": "/var/lib/\xff"}'
    assert not judge(on_path, data, tmp_path)[0]
    path = tmp_path / "daemon.json"
    path.write_bytes(data)
    code, result = run_module(capsys, docker_daemon_config, dict(path=str(path), unit_search_paths=[str(tmp_path)]))
    assert code == 1 and "is not UTF-8 text (byte 24)" in result["msg"]
    assert path.read_bytes() == data


# ------------------------------------------------------------- generated files, dockerd the judge

SPACE = st.sampled_from([" ", "", "\n", "\t", "\r\n", "  "])
NAME = st.text(alphabet="abcxyz-_.é", min_size=1, max_size=6)


def number_literal():
    """Number literals as written in a file, including ones beyond a 64-bit float and Python's int() limit."""
    digits = st.integers(1, 400).map(lambda n: "9" * n) | st.integers(-10 ** 30, 10 ** 30).map(lambda n: str(abs(n)))
    fraction = st.none() | st.integers(0, 999).map(str)
    exponent = st.none() | st.integers(-500, 500).map(lambda n: "e%d" % n)
    return st.builds(lambda sign, whole, frac, exp: sign + whole.lstrip("0").rjust(1, "0") + (
        "." + frac if frac is not None else "") + (exp or ""), st.sampled_from(["", "-"]), digits, fraction, exponent)


def string_literal():
    pieces = st.lists(st.sampled_from(["a", "é", "\\n", "\\u00e9", "\\ud800", "\\\"", "/", "\x01", "\u3000"])
                      | NAME, max_size=4)
    return pieces.map(lambda parts: '"%s"' % "".join(parts))


def free_value():
    """Any JSON value, as text: what dockerd keeps untyped (runtime options)."""
    scalar = number_literal() | string_literal() | st.sampled_from(["true", "false", "null", "NaN", "-Infinity"])
    return st.recursive(scalar, lambda inner: (
        st.lists(inner, max_size=3).map(lambda items: "[%s]" % ", ".join(items))
        | st.lists(st.tuples(NAME, inner), max_size=3).map(
            lambda pairs: "{%s}" % ", ".join('"%s": %s' % (key, value) for key, value in pairs))), max_leaves=8)


def quoted(strategy):
    return strategy.map(json.dumps)


# Settings Docker knows, with values of the right type, so that dockerd judges the reading alone.
KNOWN = {
    "debug": st.sampled_from(["true", "false"]),
    "log-level": quoted(st.sampled_from(["debug", "info", "warn", "error"])),
    "log-driver": quoted(st.just("json-file")),
    "log-opts": st.dictionaries(st.sampled_from(["max-size", "max-file", "tag"]), st.sampled_from(["3", "10m"]),
                                max_size=2).map(json.dumps),
    "max-concurrent-downloads": st.integers(1, 9).map(str),
    "labels": st.lists(st.sampled_from(["a=b", "zone=x"]), max_size=2, unique=True).map(json.dumps),
    "features": st.dictionaries(NAME, st.booleans(), max_size=2).map(json.dumps),
    "runtimes": st.dictionaries(st.sampled_from(["crun", "kata", "nvidia"]), free_value(), min_size=1, max_size=2).map(
        lambda runtimes: "{%s}" % ", ".join(
            '"%s": {"path": "/usr/bin/%s", "options": {"v": %s}}' % (name, name, value)
            for name, value in runtimes.items())),
}


@st.composite
def daemon_json(draw):
    # a key may come twice; runtimes, where any value goes, most often
    keys = draw(st.lists(st.sampled_from(sorted(KNOWN) + ["runtimes"] * 4), max_size=4))
    members = ['"%s":%s%s' % (key, draw(SPACE), draw(KNOWN[key])) for key in keys]
    separator = "," + draw(SPACE)
    body = "{" + draw(SPACE) + separator.join(members) + draw(SPACE) + "}"
    body = draw(st.sampled_from([body, body, body, "null", "[]"]))
    before = draw(st.sampled_from(["", "", "\ufeff", "\ufeff\n", " \x0b", "\u3000", "\x1c", " \ufeff"]))
    after = draw(st.sampled_from(["", "", "\n", "\x0b\n", ",", "x"]))
    return before + body + after


def has_repeated_key(text):
    """Whether an object in ``text`` (one dockerd accepted) gives a key twice."""
    repeated = []

    def pairs(items):
        repeated.extend(key for index, (key, _value) in enumerate(items) if key in dict(items[:index]))
        return dict(items)

    json.loads(text.lstrip("\ufeff").strip(), object_pairs_hook=pairs)
    return bool(repeated)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(generated=daemon_json())
def test_generated_files_are_accepted_exactly_when_dockerd_accepts_them(dockerd_bin, tmp_path_factory, generated):
    text = generated
    work = tmp_path_factory.mktemp("judged")
    accepted, reason = judge(dockerd_bin, text.encode("utf-8"), work)
    read, result = ours(text)
    event("dockerd %s" % ("accepts" if accepted else "refuses: " + reason.rsplit(": ", 1)[-1][:30]))
    if accepted and has_repeated_key(text):
        assert not read and "appears more than once" in result
        return
    assert read == accepted, (text[:500], reason, result)
    if read:
        written = render(result, text)
        assert judge(dockerd_bin, written.encode("utf-8"), work)[0], written[:500]
        kept = parse(text, "f")
        for key, value in kept.items():   # every setting the module does not own is written as it was
            if key != "runtimes":
                assert json.loads(written)[key] == value
        for name, runtime in (kept.get("runtimes") or {}).items():
            if name != "nvidia":
                assert json.loads(written)["runtimes"][name] == runtime


# ------------------------------------------------------------- the module asks dockerd before it writes

def args_for(tmp_path, **extra):
    return dict(path=str(tmp_path / "daemon.json"), unit_search_paths=[str(tmp_path)], **extra)


def test_a_good_merge_is_checked_and_written(capsys, on_path, tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{"log-driver": "json-file", "features": {"buildkit": true}}\n')
    code, result = run_module(capsys, docker_daemon_config, args_for(tmp_path, settings={"max-concurrent-downloads": 5}))
    assert code == 0 and result["changed"] is True, result
    assert result["validation"] == "accepted by dockerd --validate"
    assert json.loads(path.read_text())["features"] == {"buildkit": True}
    assert judge(on_path, path.read_bytes(), tmp_path)[0]
    code, again = run_module(capsys, docker_daemon_config, args_for(tmp_path, settings={"max-concurrent-downloads": 5}))
    assert code == 0 and again["changed"] is False and again["validation"] == "not checked: unchanged"


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_setting_of_the_wrong_type_is_refused_with_dockerds_reason(capsys, on_path, tmp_path, check_mode):
    path = tmp_path / "daemon.json"
    path.write_text('{"debug": true}\n')
    before = path.read_bytes()
    args = args_for(tmp_path, settings={"max-concurrent-downloads": "three"}, _ansible_check_mode=check_mode)
    code, result = run_module(capsys, docker_daemon_config, args)
    assert code == 1, result
    assert result["msg"].startswith("the merged %s would be refused by Docker: " % path), result["msg"]
    assert "max-concurrent-downloads" in result["msg"] and "nothing was written" in result["msg"]
    assert path.read_bytes() == before


def test_a_file_docker_refuses_already_is_named_as_such(capsys, on_path, tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{"debug": true, "no-such-setting": 1}\n')
    before = path.read_bytes()
    code, result = run_module(capsys, docker_daemon_config, args_for(tmp_path))
    assert code == 1
    assert result["msg"].startswith("%s is refused by Docker already, before the merge: " % path), result["msg"]
    assert "don't match any configuration option: no-such-setting" in result["msg"]
    assert path.read_bytes() == before
    # never: the module's own reading decides, and it keeps keys it does not know
    code, result = run_module(capsys, docker_daemon_config, args_for(tmp_path, validate="never"))
    assert code == 0 and result["validation"] == "not checked: validate is never"
    assert json.loads(path.read_text())["no-such-setting"] == 1


def test_always_fails_when_no_dockerd_can_check(capsys, tmp_path):
    missing = str(tmp_path / "no-dockerd")
    code, result = run_module(capsys, docker_daemon_config, args_for(tmp_path, validate="always", dockerd=missing))
    assert code == 1 and "validate is always, but the new" in result["msg"] and "no dockerd found" in result["msg"]
    assert not (tmp_path / "daemon.json").exists()
    code, result = run_module(capsys, docker_daemon_config, args_for(tmp_path, dockerd=missing))
    assert code == 0 and result["validation"] == "not checked: no dockerd found (%s)" % missing
