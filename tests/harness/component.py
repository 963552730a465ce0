"""A control plane component beside the test API server (kube-scheduler, kube-controller-manager), run as a process.

Each is built beside kube-apiserver by ``tools/control-plane/build`` with its option, started in a session of its
own with its output in ``directory``/<name>.log, waited for until its log says it started, and stopped by PID.
A subclass names the binary and build option, its command line and what in its log means it started.
"""

from __future__ import annotations

import pathlib
import subprocess

from harness.common import wait_until
from harness.control_plane import BUILD_SCRIPT, _alive, terminate_group

STARTUP_TIMEOUT = 60


def build_component(name, option):
    """The binary ``name``, built once per pin beside kube-apiserver by the build script's ``option``."""
    done = subprocess.run([str(BUILD_SCRIPT), option], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError("building %s failed (%s %s):\n%s" % (name, BUILD_SCRIPT, option, done.stderr[-4000:]))
    return pathlib.Path(done.stdout.strip().splitlines()[-1]) / name


class Component:
    """One component process for ``plane`` (a harness.control_plane.ControlPlane)."""

    name = option = None   # the binary, and the build script's option that builds it

    def __init__(self, plane, directory):
        self.plane = plane
        self.directory = pathlib.Path(directory)
        self.log_path = self.directory / ("%s.log" % self.name)
        self.pid = None

    def arguments(self):
        """The command line after the binary."""
        raise NotImplementedError

    def started(self, text):
        """Whether its log ``text`` says it has started."""
        raise NotImplementedError

    def describe(self):
        return "%s to start (%s)" % (self.name, self.log_path)

    def start(self):
        binary = build_component(self.name, self.option)
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            process = subprocess.Popen(  # pylint: disable=consider-using-with
                [str(binary)] + self.arguments(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.pid = process.pid
        try:
            wait_until(lambda: self.started(self.log_path.read_text(errors="replace")), STARTUP_TIMEOUT,
                       self.describe(), step=0.2, gone=self._ended, log=self.log)
        except BaseException:
            self.stop()
            raise
        return self

    def _ended(self):
        return None if _alive(self.pid) else "%s exited" % self.name

    def log(self, tail=6000):
        return self.log_path.read_text(errors="replace")[-tail:] if self.log_path.exists() else ""

    def stop(self):
        """Stops the process by its PID; safe to call twice."""
        if self.pid:
            terminate_group(self.pid)
            self.pid = None
