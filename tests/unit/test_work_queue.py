"""harness.work_queue: pytest processes given one folder run every test once between them, file by file, and
tear each file's and the session's fixtures down once per process that used them."""

from __future__ import annotations

import concurrent.futures
import pathlib
import subprocess
import sys

import pytest

from harness import work_queue

TESTS = pathlib.Path(__file__).resolve().parents[1]

CONFTEST = '''
import os, pytest
LOG = os.environ["QUEUE_LOG"]
def note(text):
    with open(LOG, "a") as handle:
        handle.write("%d %s\\n" % (os.getpid(), text))
@pytest.fixture(scope="session")
def plane():
    note("session up")
    yield
    note("session down")
@pytest.fixture(name="note")
def note_fixture():
    return note
@pytest.fixture(scope="module")
def per_file(request):
    note("module up " + request.module.__name__)
    yield
    note("module down " + request.module.__name__)
'''


def suite(folder, files):
    """Test files, each with its count of tests that take the session and module fixtures and log their run."""
    (folder / "conftest.py").write_text(CONFTEST)
    for name, count in files.items():
        (folder / ("test_%s.py" % name)).write_text("".join(
            "def test_%d(plane, per_file, note):\n    import time; time.sleep(%s)\n    note('ran %s %d')\n" % (
                index, "0.3", name, index) for index in range(count)))


def run(folder, queue, log, *args):
    env = {"PYTHONPATH": str(TESTS), "QUEUE_LOG": str(log), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.work_queue", "-p", "no:cacheprovider",
                           "--work-queue=%s" % queue, "-q", *args], cwd=folder, env=env, capture_output=True,
                          text=True, check=False)


def lines(log):
    return [line.split(" ", 1) for line in log.read_text().splitlines()] if log.exists() else []


def ran(log):
    return sorted(text for _pid, text in lines(log) if text.startswith("ran "))


ALL = ["ran a 0", "ran a 1", "ran b 0", "ran b 1", "ran b 2", "ran c 0"]


@pytest.fixture
def project(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    suite(folder, {"a": 2, "b": 3, "c": 1})
    return folder, tmp_path / "queue", tmp_path / "log"


def test_a_process_alone_runs_every_part_and_one_after_it_runs_none(project):
    folder, queue, log = project
    first = run(folder, queue, log)
    assert first.returncode == 0, first.stdout + first.stderr
    assert ran(log) == ALL
    assert "this process ran 6 of 6 tests, in 3 of 3 parts" in first.stdout
    events = [text for _pid, text in lines(log) if not text.startswith("ran ")]
    assert events == ["session up", "module up test_a", "module down test_a", "module up test_b",
                      "module down test_b", "module up test_c", "module down test_c", "session down"]
    second = run(folder, queue, log)
    assert second.returncode == 0 and "this process ran 0 of 6 tests, in 0 of 3 parts" in second.stdout
    assert ran(log) == ALL
    assert work_queue.unfinished(queue) == []


def test_parts_claimed_by_another_process_are_left_to_it_and_reported_unfinished(project):
    folder, queue, log = project
    queue.mkdir()
    (queue / "001-test_b.py").write_text("1\n")
    result = run(folder, queue, log)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ran(log) == ["ran a 0", "ran a 1", "ran c 0"]
    assert work_queue.unfinished(queue) == ["001-test_b.py"]
    check = subprocess.run([sys.executable, "-m", "harness.work_queue", "check", str(queue)], cwd=TESTS,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 1 and "1 parts were not run to their end: 001-test_b.py" in check.stderr


def test_two_processes_at_once_run_every_test_exactly_once(project):
    folder, queue, log = project
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: run(folder, queue, log), range(2)))
    assert [result.returncode for result in results] == [0, 0], [result.stdout for result in results]
    assert ran(log) == ALL
    assert work_queue.unfinished(queue) == []
    # each file's tests, and the fixtures around them, in one process
    by_file = {}
    for pid, text in lines(log):
        if text.startswith(("ran ", "module ")):
            by_file.setdefault(text.split()[-1 if text.startswith("module") else 1].replace("test_", ""),
                               set()).add(pid)
    assert all(len(pids) == 1 for pids in by_file.values()), by_file
    for pid in {pid for pid, text in lines(log) if text.startswith("ran ")}:
        mine = [text for owner, text in lines(log) if owner == pid]
        assert mine[0] == "session up" and mine[-1] == "session down", mine


def test_a_process_that_collected_other_tests_is_stopped_before_it_runs_any(project):
    folder, queue, log = project
    assert run(folder, queue, log, "-k", "test_a").returncode == 0
    other = run(folder, queue, log)
    assert other.returncode == 4, other.stdout + other.stderr
    assert "collected other tests than the process that started the queue (3 parts against 1)" in other.stderr
    assert ran(log) == ["ran a 0", "ran a 1"]


def test_a_file_whose_tests_come_in_two_runs_is_two_parts():
    class Item:
        def __init__(self, nodeid):
            self.nodeid = nodeid
    items = [Item(nodeid) for nodeid in ("t/test_x.py::a[v]", "t/test_x.py::b[v]", "t/test_y.py::a[v]",
                                         "t/test_x.py::c", "t/test_z.py::d")]
    assert [(name, [item.nodeid for item in part]) for name, part in work_queue.parts_of(items)] == [
        ("000-t_test_x.py", ["t/test_x.py::a[v]", "t/test_x.py::b[v]"]), ("001-t_test_y.py", ["t/test_y.py::a[v]"]),
        ("002-t_test_x.py", ["t/test_x.py::c"]), ("003-t_test_z.py", ["t/test_z.py::d"])]


def test_a_collection_error_stops_the_process_before_it_claims_any_part(project):
    folder, queue, log = project
    (folder / "test_broken.py").write_text("import no_such_module_here\n")
    result = run(folder, queue, log)
    assert result.returncode == 2 and "1 error during collection" in result.stdout, result.stdout
    assert ran(log) == [] and not queue.exists()


def test_a_stopped_process_leaves_its_part_unfinished_and_the_check_says_so(project, capsys):
    folder, queue, log = project
    (folder / "test_b.py").write_text("def test_0(plane, per_file, note):\n    assert False\n")
    result = run(folder, queue, log, "-x")
    assert result.returncode == 1, result.stdout
    assert ran(log) == ["ran a 0", "ran a 1"]
    assert work_queue.main(["work_queue", "check", str(queue)]) == 1
    assert "2 parts were not run to their end: 001-test_b.py, 002-test_c.py" in capsys.readouterr().err
    assert work_queue.unfinished(queue) == ["001-test_b.py", "002-test_c.py"]


def test_the_check_passes_only_a_queue_whose_every_part_ended(project, tmp_path, capsys):
    folder, queue, log = project
    assert work_queue.main(["work_queue", "check", str(tmp_path / "none")]) == 1
    assert "no list of parts" in capsys.readouterr().err
    assert work_queue.main(["work_queue", "check"]) == 2
    assert run(folder, queue, log).returncode == 0
    assert work_queue.main(["work_queue", "check", str(queue)]) == 0
