"""Offline stand-in for the get-pip.py script that ansible-test downloads.

ansible-test bootstraps pip into each virtual environment it creates by running
a get-pip script it fetches from a CI file server that this project's machines
cannot reach. It first looks in ~/.ansible/test/cache/get_pip_<version>.py;
``make`` puts this file there. It takes the same arguments (pip install
options and packages) and does the same job with the standard library's
ensurepip followed by an ordinary ``pip install`` from the package index.
"""

import subprocess
import sys

# get-pip.py accepts these but pip install does not.
GET_PIP_ONLY_OPTIONS = {"--no-setuptools", "--no-wheel"}


def main():
    subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"])
    arguments = [a for a in sys.argv[1:] if a not in GET_PIP_ONLY_OPTIONS]
    return subprocess.call([sys.executable, "-m", "pip", "install"] + arguments)


if __name__ == "__main__":
    sys.exit(main())
