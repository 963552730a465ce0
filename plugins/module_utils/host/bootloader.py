# Copyright (c) scv.gpu contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The kernel the boot loader starts next, resolved as the boot loader resolves it (private to the collection).

GRUB: the generated /boot/grub/grub.cfg sets ``default`` to grubenv's ``next_entry`` when
``grub-reboot`` wrote one, else to what GRUB_DEFAULT was when grub-mkconfig ran (``saved``
becomes grubenv's ``saved_entry``). GRUB then walks its menu with that value: each
``>``-separated part is an entry number, title or id, and a part it cannot find falls back to
the first entry. Systemd-boot: an EFI one-shot or default entry, else loader.conf's
``default`` pattern, else the first entry in the Boot Loader Specification's order.

Every answer here is (release, how) when certain, and (None, why not) when not: the caller
refuses a reboot it cannot vouch for rather than guessing a kernel.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import shlex


GRUB_FOLDERS = ("boot/grub", "boot/grub2")
SYSTEMD_BOOT_VENDOR = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"
_KERNEL_IMAGE = re.compile(r"(?:^|/)(?:vmlinuz|vmlinux|kernel)-([^/\s]+)$")
_DEFAULT_LINE = re.compile(r"""^\s*set\s+default=(["']?)(.*?)\1\s*$""")


class Unreadable(Exception):
    """A boot loader file that exists and cannot be read: the answer cannot be certain."""


def read_text(path):
    """A boot configuration file's text, or None when it does not exist."""
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    except OSError as error:
        raise Unreadable("cannot read %s: %s" % (path, error.strerror or error)) from error


def version_key(release):
    """A key that orders kernel releases as their packages do: '6.1.0-9' < '6.1.0-18' < '6.10.1'."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.findall(r"\d+|[A-Za-z]+", release)]


def kernel_release(image):
    """'6.1.0-18-amd64' from '/boot/vmlinuz-6.1.0-18-amd64' or '/vmlinuz-…'; None for anything else."""
    match = _KERNEL_IMAGE.search(image or "")
    return match.group(1) if match else None


GRUBENV_SIGNATURE = "# GRUB Environment Block\n"


def read_grubenv(path, name):
    """({name: value}, note) from a GRUB environment block (grub-editenv's format); ({}, None) when there is none.

    GRUB loads no block that lacks its signature (an empty file, or one written by an editor), and so none of its
    next_entry or saved_entry: such a block gives ({}, a note that says so, ``name`` being the file as the host
    names it).
    """
    text = read_text(path)
    if text is None:
        return {}, None
    if not text.startswith(GRUBENV_SIGNATURE):
        return {}, ("GRUB ignores %s, which is not a GRUB environment block (it does not start with '# GRUB "
                    "Environment Block'): write it anew with grub-editenv %s create, then set the entry with "
                    "grub-set-default or grub-reboot" % (name, name))
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")), None


def grub_default_setting(root):
    """(value, file) of GRUB_DEFAULT as grub-mkconfig reads it: /etc/default/grub, then each
    /etc/default/grub.d/*.cfg in order, the last assignment winning; (None, None) when unset."""
    value = source = None
    files = [os.path.join(root, "etc", "default", "grub")]
    files += sorted(glob.glob(os.path.join(root, "etc", "default", "grub.d", "*.cfg")))
    for path in files:
        text = read_text(path)
        for line in (text or "").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            if words and words[0] == "export":
                words = words[1:]
            if words and words[0].startswith("GRUB_DEFAULT="):
                value, source = words[0].split("=", 1)[1], "/" + os.path.relpath(path, root)
    return value, source


def _menu_words(line):
    """The words of a menuentry or submenu line, its titles unquoted ('\\'' included)."""
    try:
        return shlex.split(line.rsplit("{", 1)[0])
    except ValueError:
        return []


def parse_grub_menu(text):
    """The menu of a grub.cfg: [{'kind', 'title', 'id', 'release', 'image', 'children'}], as GRUB numbers it.

    Blocks that are neither (``function``, ``if`` bodies written with braces) are skipped.
    """
    top = []
    stack = [(top, None)]           # (items of this level, the item whose block this is)
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        head = line.split(None, 1)[0]
        if head in ("menuentry", "submenu") and line.endswith("{"):
            words = _menu_words(line)
            entry_id = None
            for index, word in enumerate(words[:-1]):
                if word in ("$menuentry_id_option", "${menuentry_id_option}", "--id"):
                    entry_id = words[index + 1]
            item = {"kind": "entry" if head == "menuentry" else "submenu",
                    "title": words[1] if len(words) > 1 else "", "id": entry_id, "image": None, "release": None,
                    "children": []}
            stack[-1][0].append(item)
            stack.append((item["children"], item))
        elif line.endswith("{"):
            stack.append(([], None))
        elif line == "}" and len(stack) > 1:
            stack.pop()
        elif head in ("linux", "linuxefi", "linux16") and stack[-1][1] is not None:
            words = line.split()
            if len(words) > 1 and stack[-1][1]["image"] is None:
                stack[-1][1]["image"] = words[1]
                stack[-1][1]["release"] = kernel_release(words[1])
    return top


def _grub_default_in_cfg(text):
    """The value grub.cfg sets ``default`` to when no next_entry is pending ('0', '${saved_entry}', '1>2')."""
    values = [match.group(2) for match in map(_DEFAULT_LINE.match, text.splitlines()) if match]
    values = [value for value in values if value not in ("${next_entry}", "$next_entry")]
    return values[-1] if values else None


def _matches(item, part):
    return part in (item["title"], item["id"])


def walk_menu(menu, default):
    """(item, None) for the entry GRUB boots with ``default``, or (None, why not)."""
    level, item, parts = menu, None, default.split(">")
    for position, part in enumerate(parts):
        part = part.strip()
        if part.isdigit():
            chosen = level[int(part)] if int(part) < len(level) else None
        else:
            chosen = next((candidate for candidate in level if _matches(candidate, part)), None)
        if chosen is None:
            if not level or level[0]["kind"] != "entry":
                return None, "'%s' is not in the menu, and its first entry is not a kernel" % default
            chosen = level[0]
            if position == 0:
                return chosen, "'%s' is not in the menu, so GRUB falls back to its first entry" % default
        item = chosen
        if item["kind"] == "submenu":
            level = item["children"]
        elif position < len(parts) - 1:
            return None, "'%s' goes on past the entry '%s', which is not a submenu" % (default, item["title"])
    if item is None or item["kind"] != "entry":
        return None, "'%s' names the submenu '%s', not an entry in it" % (default, item["title"] if item else "")
    return item, None


def grub_next(root):
    """(release, how) for a GRUB system, (None, why not) when GRUB's answer is not certain, or None
    when there is no grub.cfg (another boot loader)."""
    found = ((folder, read_text(os.path.join(root, folder, "grub.cfg"))) for folder in GRUB_FOLDERS)
    folder, text = next(((folder, text) for folder, text in found if text is not None), (None, None))
    if text is None:
        return None
    cfg_name, env_name = "/%s/grub.cfg" % folder, "/%s/grubenv" % folder
    env, ignored = read_grubenv(os.path.join(root, folder, "grubenv"), env_name)
    generated = _grub_default_in_cfg(text)
    setting, setting_file = grub_default_setting(root)
    expected = "${saved_entry}" if setting == "saved" else setting
    if env.get("next_entry"):
        default, how = env["next_entry"], "next_entry in %s (grub-reboot)" % env_name
    elif generated is None:
        return None, "%s sets no default entry" % cfg_name
    elif setting is not None and expected != generated:
        return None, ("GRUB_DEFAULT in %s is '%s', but %s was generated with '%s' before that: run update-grub, "
                      "then check again" % (setting_file, setting, cfg_name, generated))
    elif generated in ("${saved_entry}", "$saved_entry"):
        default, how = env.get("saved_entry", ""), "saved_entry in %s" % env_name
        if not default:
            default, how = "0", "the first entry of %s, as saved_entry in %s is empty" % (cfg_name, env_name)
    else:
        default, how = generated, "GRUB_DEFAULT=%s, in %s" % (generated, cfg_name)
    menu = parse_grub_menu(_with_bls(text, root))
    item, note = walk_menu(menu, default)
    if item is None:
        return None, "%s: %s" % (how, note)
    if note:
        how = "%s: %s" % (how, note)
    if ignored:
        how = "%s (%s)" % (how, ignored)
    release = item["release"] or _linked_release(root, item["image"])
    if not release:
        return None, "%s boots '%s', which starts no Linux kernel image GRUB names" % (how, item["title"])
    if not os.path.exists(os.path.join(root, "boot", os.path.basename(item["image"]))):
        return None, ("%s boots '%s', whose kernel image %s is not in /boot: run update-grub, then check again"
                      % (how, item["title"], item["image"]))
    link = "" if item["release"] else " (%s is a link to vmlinuz-%s)" % (item["image"], release)
    return release, "%s, the entry '%s'%s" % (how, item["title"], link)


def _linked_release(root, image, hops=8):
    """The release of the kernel image that ``image`` (such as /boot/vmlinuz) links to in /boot, as GRUB
    follows the link; None for anything else. Links are followed inside ``root``'s /boot only."""
    path = os.path.join(root, "boot", os.path.basename(image or ""))
    for _hop in range(hops):
        if not image or not os.path.islink(path):
            return None
        target = os.path.basename(os.readlink(path))
        release = kernel_release(target)
        if release:
            return release
        path = os.path.join(root, "boot", target)
    return None


def _with_bls(text, root):
    """grub.cfg's text with each ``blscfg`` line replaced by the BLS entries as menu entries."""
    if not re.search(r"^\s*blscfg\s*$", text, re.MULTILINE):
        return text
    lines = []
    for entry in bls_entries(root):
        title = (entry["title"] or entry["id"]).replace("'", "'\\''")
        lines.append("menuentry '%s' --id '%s' {\n linux %s\n}" % (title, entry["id"], entry["image"] or ""))
    return re.sub(r"^\s*blscfg\s*$", lambda match: "\n".join(lines), text, flags=re.MULTILINE)


def bls_entries(root, folder="boot/loader/entries"):
    """The Boot Loader Specification entries in the order loaders show them: those with a sort-key
    first by it, then by version, newest first; [{'id', 'title', 'image', 'release'}]."""
    entries = []
    for path in glob.glob(os.path.join(root, folder, "*.conf")):
        fields = {}
        for line in (read_text(path) or "").splitlines():
            key, _sep, value = line.strip().partition(" ")
            if key and not key.startswith("#"):
                fields.setdefault(key, value.strip())
        entry_id = os.path.basename(path)[:-len(".conf")]
        image = fields.get("linux")
        entries.append({"id": entry_id, "title": fields.get("title"), "image": image,
                        "release": kernel_release(image) if image else None, "sort_key": fields.get("sort-key"),
                        "version": fields.get("version") or entry_id})
    entries.sort(key=lambda entry: version_key(entry["version"]), reverse=True)
    entries.sort(key=lambda entry: (entry["sort_key"] is None, entry["sort_key"] or ""))
    return entries


def _efi_variable(efivars, name):
    """A systemd-boot EFI variable's UTF-16 string (after its 4 bytes of attributes), or None."""
    if not efivars:
        return None
    try:
        with open(os.path.join(efivars, "%s-%s" % (name, SYSTEMD_BOOT_VENDOR)), "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return data[4:].decode("utf-16-le", "replace").rstrip("\x00") or None


def bls_next(root, efivars=None):
    """(release, how) for a systemd-boot system, (None, why not), or None when there are no entries."""
    entries = bls_entries(root)
    if not entries:
        return None
    loader = {}
    for line in (read_text(os.path.join(root, "boot", "loader", "loader.conf")) or "").splitlines():
        key, _sep, value = line.strip().partition(" ")
        loader[key] = value.strip()
    pattern = _efi_variable(efivars, "LoaderEntryOneShot")
    how = "the EFI variable LoaderEntryOneShot"
    if not pattern:
        pattern, how = _efi_variable(efivars, "LoaderEntryDefault"), "the EFI variable LoaderEntryDefault"
    if not pattern and loader.get("default"):
        pattern, how = loader["default"], "default in /boot/loader/loader.conf"
        if pattern == "@saved":
            pattern, how = _efi_variable(efivars, "LoaderEntryLastBooted"), "@saved: LoaderEntryLastBooted"
            if not pattern:
                return None, "/boot/loader/loader.conf boots @saved, and LoaderEntryLastBooted cannot be read"
    if pattern:
        chosen = [entry for entry in entries if fnmatch.fnmatchcase(entry["id"] + ".conf", pattern)
                  or fnmatch.fnmatchcase(entry["id"], pattern)]
        if not chosen:
            return None, "%s is '%s', which matches no entry in /boot/loader/entries" % (how, pattern)
    else:
        chosen, how = entries, "the first entry in /boot/loader/entries, in the Boot Loader Specification's order"
    if not chosen[0]["release"]:
        return None, "%s names the entry %s, which starts no Linux kernel image" % (how, chosen[0]["id"])
    return chosen[0]["release"], "%s, the entry %s" % (how, chosen[0]["id"])


def next_boot(root="/", grubby_default=None, efivars=None):
    """(release, how) for the kernel the next boot starts, or (None, why it cannot be told).

    ``grubby_default`` is what ``grubby --default-kernel`` printed (the RHEL family), if anything.
    """
    if grubby_default:
        release = kernel_release(os.path.basename(grubby_default.strip()))
        if release:
            return release, "grubby --default-kernel"
    try:
        answer = grub_next(root) or bls_next(root, efivars)
    except Unreadable as error:
        return None, str(error)
    if answer:
        return answer
    return None, ("no boot loader configuration was found (neither /boot/grub/grub.cfg, /boot/grub2/grub.cfg nor "
                  "/boot/loader/entries)")
