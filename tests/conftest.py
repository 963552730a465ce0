"""Fixtures shared by the unit and integration tests.

The NVML simulator (tests/nvml_simulator) stands in for the driver's
libnvidia-ml.so.1; ``make`` builds it into build/nvml-simulator. In-process
tests need it on LD_LIBRARY_PATH when Python starts (``make unit`` does that);
subprocess tests get it through the environment they are started with.
"""

from __future__ import annotations

import ctypes
import pytest

from harness.paths import SIMULATOR_DIR, scenario_path


@pytest.fixture
def nvml_simulator(monkeypatch):
    """The simulator as loaded in this process; call it with a scenario name to switch.

    Refuses to run against a real libnvidia-ml.so.1, which on a GPU machine would
    otherwise answer instead and make every expectation wrong.
    """
    try:
        library = ctypes.CDLL("libnvidia-ml.so.1")
        library.nvmlsimCallCount.restype = ctypes.c_ulonglong
        library.nvmlsimCallCountOf.restype = ctypes.c_ulonglong
        library.nvmlsimCallCountOf.argtypes = [ctypes.c_char_p]
        library.nvmlsimSpentNs.restype = ctypes.c_ulonglong
    except (OSError, AttributeError):
        pytest.fail(
            "the NVML simulator is not what loads as libnvidia-ml.so.1 in this process: "
            "run these tests through `make unit` (it builds %s and sets LD_LIBRARY_PATH)" % SIMULATOR_DIR
        )

    class Simulator:
        def use(self, name):
            """A shipped scenario by name, or any scenario file by path."""
            path = name if "/" in str(name) else scenario_path(name)
            monkeypatch.setenv("NVMLSIM_CONFIG", str(path))

        @staticmethod
        def latency(model):
            monkeypatch.setenv("NVMLSIM_LATENCY", model)

        @staticmethod
        def calls_of(function):
            return library.nvmlsimCallCountOf(function.encode())

        @staticmethod
        def spent_ms():
            return library.nvmlsimSpentNs() / 1e6

        @staticmethod
        def calls():
            return library.nvmlsimCallCount()

        @staticmethod
        def reset_calls():
            library.nvmlsimResetCallCount()

    return Simulator()
