"""The /dev/char links to the NVIDIA device nodes, on a prepared /dev (character devices made with mknod)."""

from __future__ import annotations

import os
import stat

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.host.dev_char import (
    DevCharError,
    describe,
    device_nodes,
    link_states,
    make_links,
    summary,
)


def mknod(path, major, minor):
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(str(path), 0o600 | 0o020000, os.makedev(major, minor))


@pytest.fixture
def dev(tmp_path):
    dev = tmp_path / "dev"
    mknod(dev / "nvidia0", 195, 0)
    mknod(dev / "nvidia1", 195, 1)
    mknod(dev / "nvidiactl", 195, 255)
    mknod(dev / "nvidia-uvm", 509, 0)
    mknod(dev / "nvidia-caps" / "nvidia-cap1", 238, 1)
    mknod(dev / "null", 1, 3)                      # not the driver's
    (dev / "nvidia-fake").write_text("")           # not a character device
    mknod(dev / "nvidia-caps" / "other", 238, 9)   # not a capability node's name
    return dev


def test_the_driver_nodes_are_found_with_their_numbers(dev):
    assert [(os.path.relpath(path, dev), major, minor) for path, major, minor in device_nodes(str(dev))] == [
        ("nvidia-caps/nvidia-cap1", 238, 1), ("nvidia-uvm", 509, 0), ("nvidia0", 195, 0), ("nvidia1", 195, 1),
        ("nvidiactl", 195, 255)]


def test_missing_links_are_made_relative_then_all_are_ok(dev):
    states = link_states(str(dev))
    assert {os.path.basename(e["link"]): (e["target"], e["state"]) for e in states} == {
        "238:1": ("../nvidia-caps/nvidia-cap1", "missing"), "509:0": ("../nvidia-uvm", "missing"),
        "195:0": ("../nvidia0", "missing"), "195:1": ("../nvidia1", "missing"), "195:255": ("../nvidiactl", "missing")}
    assert summary(states, str(dev)).startswith("238:1 missing for %s/nvidia-caps/nvidia-cap1; 509:0 missing" % dev)
    before, after = describe(states)
    assert before == "" and "195:0 -> ../nvidia0\n" in after
    make_links(states)
    assert os.readlink(dev / "char" / "195:0") == "../nvidia0"
    assert stat.S_IMODE(os.stat(dev / "char").st_mode) == 0o755
    assert os.stat(dev / "char" / "238:1").st_rdev == os.makedev(238, 1)
    again = link_states(str(dev))
    assert {e["state"] for e in again} == {"ok"}
    assert summary(again, str(dev)) == "every NVIDIA device node has its /dev/char link"
    assert describe(again)[0] == describe(again)[1]
    assert not [name for name in os.listdir(dev / "char") if name.startswith(".")]


def test_a_link_left_by_an_earlier_load_is_replaced_and_other_links_are_left_alone(dev):
    char = dev / "char"
    char.mkdir()
    (char / "509:0").symlink_to("../nvidia-uvm-gone")      # dangling
    (char / "195:0").symlink_to("../nvidia1")              # reaches another node
    (char / "1:3").symlink_to("../null")                   # udev's, not ours
    (char / "195:1").symlink_to(str(dev / "nvidia1"))     # absolute, but right
    states = {os.path.basename(e["link"]): e["state"] for e in link_states(str(dev))}
    assert (states["509:0"], states["195:0"], states["195:1"]) == ("wrong", "wrong", "ok")
    make_links(link_states(str(dev)))
    assert os.readlink(char / "509:0") == "../nvidia-uvm" and os.readlink(char / "195:0") == "../nvidia0"
    assert os.readlink(char / "1:3") == "../null" and os.readlink(char / "195:1") == str(dev / "nvidia1")


def test_no_nodes_no_links(tmp_path):
    assert link_states(str(tmp_path)) == []
    assert summary([], "/dev") == "no NVIDIA device node in /dev yet: the udev rule links them when the driver binds"


def test_a_folder_in_the_way_is_named(dev):
    (dev / "char" / "195:0").mkdir(parents=True)
    with pytest.raises(DevCharError, match=r"cannot link .*/char/195:0 to .*/nvidia0: Is a directory; remove what is at"):
        make_links(link_states(str(dev)))


def test_a_scratch_link_left_by_an_interrupted_run_is_replaced(dev):
    (dev / "char").mkdir()
    (dev / "char" / ".195:0.scv-gpu").symlink_to("../nvidia1")
    make_links(link_states(str(dev)))
    assert os.readlink(dev / "char" / "195:0") == "../nvidia0"
    assert not os.path.lexists(dev / "char" / ".195:0.scv-gpu")
