"""Two pytest processes share one test run, file by file (``-p harness.work_queue --work-queue=DIR``;
with a space rather than ``=``, pytest takes an existing DIR for a test path when it looks for its root folder).

make test runs the integration tests in one process while molecule and sanity take the other core, and in a
second process once they have ended. Each process collects the same tests and walks them in the same order,
split into parts: a part is a run of consecutive tests from one file (pytest may order a file's tests in two
runs, by the session fixtures they take). A process runs a part only when it claims it first, by making the
part's file in DIR (a hard link, which fails where the name exists); it marks the part done when its tests
have run. A process that joins late finds the early parts claimed and takes what is left; the first to start
claims everything when alone.

The processes must collect the same parts: the first writes their list to DIR/parts, the others compare, and
one that collected other tests stops with a usage error, so that no part runs twice or never. ``python -m
harness.work_queue check DIR`` says whether every part listed was run to its end.

Tests that need a machine-wide resource (the kubelet's device-plugin folder) take a lock of their own; the
others use folders and ports of their own, as they do when the ansible-core lines run side by side.
"""

from __future__ import annotations

import os
import pathlib
import re
import sys

import pytest

PARTS = "parts"
DONE = ".done"


def pytest_addoption(parser):
    parser.addoption("--work-queue", metavar="DIR", default=None,
                     help="share the tests with other pytest processes given the same empty folder, part by part")


def parts_of(items):
    """[(name, [item, ...]), ...]: runs of consecutive items from one file, each named by its order and file."""
    parts = []
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if not parts or parts[-1][2] != path:
            name = "%03d-%s" % (len(parts), re.sub(r"[^A-Za-z0-9_.-]", "_", path))
            parts.append((name, [], path))
        parts[-1][1].append(item)
    return [(name, part_items) for name, part_items, _path in parts]


def claim(folder, name, text=None):
    """True when this process made the file ``name`` (holding ``text``, by default its pid), whole, at once;
    False when another process had made it."""
    scratch = folder / (".%s.%d" % (name, os.getpid()))
    scratch.write_text("%d\n" % os.getpid() if text is None else text, encoding="utf-8")
    try:
        os.link(str(scratch), str(folder / name))   # fails when the name exists; readers never see it half written
    except FileExistsError:
        return False
    finally:
        scratch.unlink()
    return True


def agree_on_parts(folder, names):
    """Writes the list of parts, or checks it against the one written first."""
    listing = "".join(name + "\n" for name in names)
    if claim(folder, PARTS, listing):
        return
    written = (folder / PARTS).read_text(encoding="utf-8")
    if written != listing:
        raise pytest.UsageError(
            "--work-queue %s: this process collected other tests than the process that started the queue "
            "(%d parts against %d): give both the same arguments and environment, and an empty folder for each "
            "new run" % (folder, len(names), len(written.splitlines())))


class Queue:
    """The parts this process claims, in order, and the count of the tests it ran."""

    def __init__(self, folder, parts):
        self.folder, self.parts = folder, parts
        self.ran = 0
        self.claimed = 0

    def items(self):
        """(item, next item this process runs or None, the name of the part it ends or None), claiming a part
        only when its first test is next: a part's last test knows what comes after it, so that pytest tears
        down the fixtures of a file when it leaves the file, and the session's only at the end."""
        mine = ((name, items) for name, items in self.parts if claim(self.folder, name))
        current = next(mine, None)
        while current is not None:
            name, items = current
            self.claimed += 1
            for index, item in enumerate(items[:-1]):
                yield item, items[index + 1], None
            following = next(mine, None)
            yield items[-1], None if following is None else following[1][0], name
            current = following

    def done(self, name):
        (self.folder / (name + DONE)).write_text("%d\n" % os.getpid(), encoding="utf-8")


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    folder = session.config.getoption("work_queue")
    if folder is None or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted("%d error%s during collection" % (
            session.testsfailed, "" if session.testsfailed == 1 else "s"))
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    parts = parts_of(session.items)
    agree_on_parts(folder, [name for name, _items in parts])
    queue = Queue(folder, parts)
    session.config.stash[QUEUE] = queue
    for item, nextitem, ends in queue.items():
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        queue.ran += 1
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        if ends is not None:
            queue.done(ends)
    return True


QUEUE = pytest.StashKey[Queue]()


def pytest_terminal_summary(terminalreporter, config):
    queue = config.stash.get(QUEUE, None)
    if queue is not None:
        terminalreporter.write_line("work queue %s: this process ran %d of %d tests, in %d of %d parts" % (
            queue.folder, queue.ran, sum(len(items) for _name, items in queue.parts), queue.claimed,
            len(queue.parts)))


def unfinished(folder):
    """The parts listed in the folder that no process ran to the end."""
    folder = pathlib.Path(folder)
    names = (folder / PARTS).read_text(encoding="utf-8").split()
    return [name for name in names if not (folder / (name + DONE)).exists()]


def main(argv):
    if len(argv) != 3 or argv[1] != "check":
        sys.stderr.write("usage: python -m harness.work_queue check DIR\n")
        return 2
    if not (pathlib.Path(argv[2]) / PARTS).exists():
        sys.stderr.write("work queue %s: no list of parts: no process started on it\n" % argv[2])
        return 1
    left = unfinished(argv[2])
    if left:
        sys.stderr.write("work queue %s: %d parts were not run to their end: %s\n" % (
            argv[2], len(left), ", ".join(left)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
