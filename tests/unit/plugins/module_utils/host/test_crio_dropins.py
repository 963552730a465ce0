from __future__ import annotations

import os

from ansible_collections.scv.gpu.plugins.module_utils.host.crio_dropins import ordered, walk, walk_key


def test_a_subfolders_files_come_where_its_name_falls_among_its_siblings(tmp_path):
    """As filepath.Walk: "a" sorts before "a.conf", so a/z.conf is read before a.conf, though the path
    "a.conf" sorts before "a/z.conf" byte for byte; capitals before lower case (byte order)."""
    root = tmp_path / "crio.conf.d"
    (root / "a").mkdir(parents=True)
    for name in ("a.conf", "a/z.conf", "B.conf", "b.conf", ".hidden.conf"):
        (root / name).write_text("")
    assert [os.path.relpath(path, root) for path in walk(str(root))] == [
        ".hidden.conf", "B.conf", "a/z.conf", "a.conf", "b.conf"]


def test_links_are_not_followed_a_link_to_a_file_is_read_and_one_to_a_folder_is_read_as_a_file(tmp_path):
    root = tmp_path / "crio.conf.d"
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "inner").mkdir(parents=True)
    (elsewhere / "x.conf").write_text("")
    (elsewhere / "inner" / "y.conf").write_text("")
    root.mkdir()
    (root / "10-link.conf").symlink_to(elsewhere / "x.conf")
    (root / "20-folder").symlink_to(elsewhere / "inner")
    assert [os.path.relpath(path, root) for path in walk(str(root))] == ["10-link.conf", "20-folder"]


def test_a_missing_folder_has_nothing(tmp_path):
    assert walk(str(tmp_path / "none")) == []


def test_finds_listing_is_put_in_the_same_order():
    root = "/etc/crio/crio.conf.d"
    listed = [{"path": root + "/a.conf", "isdir": False}, {"path": root + "/a", "isdir": True},
              {"path": root + "/a/z.conf", "isdir": False}, {"path": root + "/B.conf", "isdir": False}]
    assert ordered(root, listed) == [root + "/B.conf", root + "/a/z.conf", root + "/a.conf"]
    assert walk_key(root, root + "/a/z.conf") == (b"a", b"z.conf")


def test_a_drop_in_folder_that_is_a_link_is_read_as_one_file(tmp_path):
    """filepath.Walk does not follow its root either: CRI-O reads a linked drop-in folder as a file (and fails)."""
    real = tmp_path / "real.d"
    real.mkdir()
    (real / "10.conf").write_text("")
    (tmp_path / "crio.conf.d").symlink_to(real)
    assert walk(str(tmp_path / "crio.conf.d")) == [str(tmp_path / "crio.conf.d")]
