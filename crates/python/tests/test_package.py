"""The installed package: the wheel carries the reference plugins and finds them by name with no
LSGD_PLUGIN_PATH, a user's own plugin (a path, LSGD_PLUGIN_PATH) wins over them, the look-up
never lists the interpreter's folder, and the build backend says what a build needs when
cargo is missing instead of downloading a toolchain."""

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import lsgd_torch
from lsgd_torch import WasmLR, _native

from conftest import CACHE, ROOT

BACKEND = ROOT / "crates" / "python" / "build_backend" / "lsgd_torch_build.py"
PACKAGED = Path(lsgd_torch.__file__).parent / "plugins"
SHAPE = dict(epochs=2, steps_per_epoch=10, global_batch=256)


def backend():
    spec = importlib.util.spec_from_file_location("lsgd_torch_build", BACKEND)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def clean_env(**extra):
    """An environment with no LSGD_PLUGIN_PATH: what a user has right after pip install."""
    keep = ["PATH", "HOME", "LSGD_CACHE_DIR", "LANG"]
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(extra)
    return env


def test_the_wheel_carries_the_reference_plugins_and_no_test_guests():
    names, _ = backend().reference_plugins()
    assert {"warmup", "codec-top-k", "lars", "batch-ramp"} <= set(names)
    assert not {n for n in names if n.startswith("bad-") or n.startswith("lsgd-")}
    wheel = next((CACHE / "wheels").glob("lsgd_torch-*.whl"))
    listed = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".wasm")}
    assert listed == {f"lsgd_torch/plugins/{n}.wasm" for n in names}


def test_bare_names_load_the_packaged_plugins_without_lsgd_plugin_path():
    code = """
import sys, torch, lsgd_torch
from lsgd_torch import CodecState, WasmLR, _native
opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
s = WasmLR(opt, "warmup", epochs=2, steps_per_epoch=10, global_batch=256)
c = CodecState(None, "codec-top-k")
print(s.policy.label)
print(c.codec.label)
print(*_native.plugin_dirs(), sep="\\n")
"""
    done = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True,
                          text=True, cwd="/")
    assert done.returncode == 0, done.stderr
    schedule, codec, *dirs = done.stdout.splitlines()
    assert Path(schedule) == (PACKAGED / "warmup.wasm").resolve()
    assert Path(codec) == (PACKAGED / "codec-top-k.wasm").resolve()
    assert dirs == [str(PACKAGED)]


def test_a_users_own_plugin_wins_over_the_packaged_one(tmp_path, monkeypatch, plugin_dir):
    # A different schedule under the name `warmup`, in LSGD_PLUGIN_PATH.
    (tmp_path / "warmup.wasm").write_bytes((plugin_dir / "constant.wasm").read_bytes())
    monkeypatch.setenv("LSGD_PLUGIN_PATH", str(tmp_path))
    assert _native.plugin_dirs() == [tmp_path, PACKAGED]
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    found = WasmLR(opt, "warmup", **SHAPE).policy
    assert (found.name, Path(found.label).parent) == ("constant", tmp_path.resolve())
    # An explicit path, whatever the look-up holds.
    monkeypatch.delenv("LSGD_PLUGIN_PATH")
    given = WasmLR(opt, str(tmp_path / "warmup.wasm"), **SHAPE).policy
    assert (given.name, given.label) == ("constant", str(tmp_path / "warmup.wasm"))
    assert WasmLR(opt, "warmup", **SHAPE).policy.name == "warmup"


def test_a_name_found_nowhere_names_the_folders_looked_in_and_not_the_interpreters(
        monkeypatch, tmp_path):
    monkeypatch.setenv("LSGD_PLUGIN_PATH", str(tmp_path))
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    with pytest.raises(FileNotFoundError) as e:
        WasmLR(opt, "no-such-plugin", **SHAPE)
    assert str(e.value).startswith(
        f"no plugin file `no-such-plugin`: not a path, and no no-such-plugin.wasm in "
        f"{tmp_path}, {PACKAGED} ("
    )
    assert str(Path(sys.executable).parent) not in str(e.value)


def run_hook(hook, path, *args, **env):
    """Calls a hook of the in-tree backend as pip's build frontend does: in a fresh interpreter,
    in the project's folder, with the backend's folder on sys.path."""
    code = f"import lsgd_torch_build as b; print(b.{hook}(*{list(map(str, args))!r}))"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=BACKEND.parents[1], capture_output=True, text=True,
        env=clean_env(PATH=path, PYTHONPATH=str(BACKEND.parent), **env),
    )


def test_a_build_without_cargo_stops_at_once_with_what_it_needs(tmp_path):
    # A PATH without cargo (the interpreter is called by its full path).
    for hook, args in [("get_requires_for_build_wheel", []),
                       ("prepare_metadata_for_build_wheel", [tmp_path]),
                       ("build_wheel", [tmp_path])]:
        done = run_hook(hook, str(tmp_path), *args)
        assert done.returncode == 1, (hook, done.stdout, done.stderr)
        assert done.stderr.startswith(
            "lsgd-torch: cannot build the extension: `cargo` is not on PATH."), done.stderr
        for needed in ["Rust >= 1.95 with cargo", "wasm32-wasip2", "about 20 minutes on 2 cores",
                       "bash scripts/python-package.sh --release DIR",
                       "$LSGD_CACHE_ROOT/wheels/", "LSGD_TORCH_INSTALL_RUST=1"]:
            assert needed in done.stderr, (needed, done.stderr)
        assert "puccinialin" not in done.stdout + done.stderr
        assert list(tmp_path.iterdir()) == []


def test_opting_in_hands_the_missing_toolchain_to_maturin(tmp_path):
    # maturin's backend then asks for puccinialin, which downloads Rust (not run here).
    done = run_hook("get_requires_for_build_wheel", str(tmp_path), LSGD_TORCH_INSTALL_RUST="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['puccinialin']"
    # With cargo on PATH nothing is asked for.
    done = run_hook("get_requires_for_build_wheel", os.environ["PATH"])
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
