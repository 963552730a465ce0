"""host/toml_keys.py: a containerd config's top-level version and imports read without tomllib, as tomllib
reads them, on the shapes TOML allows them; what it cannot read is refused, never misread."""

from __future__ import annotations

import tomllib

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.host.toml_keys import TomlKeysError, top_level_keys

AGREE = [
    "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n",
    "version = 2\n",
    "# containerd\nversion=2  # the 1.x format\nimports = ['conf.d/*.toml', \"/opt/x.toml\"]\n[plugins]\n",
    "imports = [\n  \"/a/[0-9]*.toml\",  # a glob with brackets\n  '/b/c].toml',\n]\nversion = 3\n",
    "\"version\" = 3\n'imports' = []\n",
    "imports = [\"/a\",\"/b\"]\n",
    "version = 3\nimports = [ \"/e/\\u00e9.toml\" , \"/t/\\\"q\\\".toml\" ]\n",
    "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\n  imports = [\"not/top/level\"]\n",
    "version = 3\n\n[grpc]\naddress = \"/run/containerd/containerd.sock\"\n",
    "",
    "version = \"3\"  # a string: read as such, for containerd's refusal\n",
    "version = 3.0\n",
]


@pytest.mark.parametrize("text", AGREE)
def test_reads_what_tomllib_reads(text):
    whole = tomllib.loads(text)
    assert top_level_keys(text) == {key: whole[key] for key in ("version", "imports") if key in whole}


@pytest.mark.parametrize("text", [
    "version = 3_0\n",
    "version = [3]\n",
    "imports = \"/etc/containerd/conf.d\"\n",  # not an array
    "imports = [3]\n",
    "imports = [,\"/a\"]\n",
    "imports = [\"/a\",,\"/b\"]\n",
    "imports = [\"/a\" \"/b\"]\n",             # no comma
    "imports = [\"/a\",\n",                     # never closed
    "imports = [\"\"\"/a\"\"\"]\n",           # multi-line strings are not read here
    "imports = [\"/\\U0001F600\"]\n",          # an escape TOML has and JSON has not
])
def test_refuses_what_it_cannot_read(text):
    with pytest.raises(TomlKeysError):
        top_level_keys(text)
