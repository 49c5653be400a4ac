"""Shared fixtures of lsgd-torch's tests: the host binary (the oracle for traces and training),
the reference plugins, and a process-wide torch set-up small enough for a 2-core CI machine."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("LSGD_CACHE_ROOT", Path.home() / ".cache" / "lsgd-host"))
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", CACHE / "target"))

os.environ.setdefault("LSGD_PLUGIN_PATH", str(TARGET / "plugins"))
torch.set_num_threads(1)


def host_binary():
    """The lsgd-host binary the test command built (LSGD_BIN), else the debug build."""
    path = Path(os.environ.get("LSGD_BIN", TARGET / "debug" / "lsgd-host"))
    if not path.is_file():
        raise FileNotFoundError(
            f"no lsgd-host binary at {path}: run scripts/test.sh, or `cargo build` and set LSGD_BIN"
        )
    return path


@pytest.fixture(scope="session")
def host():
    """Runs ``lsgd-host ARGS…`` and returns its stdout (text); a failure shows its stderr."""
    binary = host_binary()

    def run(*args, cwd=None):
        done = subprocess.run(
            [str(binary), *map(str, args)], capture_output=True, text=True, cwd=cwd
        )
        if done.returncode != 0:
            raise AssertionError(
                f"lsgd-host {' '.join(map(str, args))} exited {done.returncode}:\n{done.stderr}"
            )
        return done.stdout

    return run


@pytest.fixture(scope="session")
def plugin_dir():
    """Where the reference plugins were built (scripts/build-plugins.sh)."""
    d = Path(os.environ["LSGD_PLUGIN_PATH"].split(os.pathsep)[0])
    if not (d / "warmup.wasm").is_file():
        raise FileNotFoundError(f"no reference plugins in {d}: run scripts/build-plugins.sh")
    return d


@pytest.fixture(scope="session")
def fashion_mnist():
    """The directory of the Fashion-MNIST IDX files (Debian's dataset-fashion-mnist)."""
    for d in [os.environ.get("LSGD_DATA"), "/usr/share/datasets/fashion-mnist"]:
        if d and Path(d, "train-images-idx3-ubyte.gz").exists():
            return Path(d)
    raise FileNotFoundError("no Fashion-MNIST: scripts/setup.sh installs dataset-fashion-mnist")


def torchrun():
    """The torchrun of the venv that runs the tests."""
    found = shutil.which("torchrun", path=str(Path(os.sys.executable).parent))
    if not found:
        raise FileNotFoundError("no torchrun beside the test interpreter")
    return found
