"""lsgd-torch's PEP 517 build backend: maturin's, with two steps before it builds.

1. Without ``cargo`` on PATH it stops at once and says what a build needs and takes, and where
   a wheel comes from without one. maturin's own backend would instead download a Rust
   toolchain (~1.3 GB, with puccinialin) into the user's cache while pip shows only "still
   running..."; ``LSGD_TORCH_INSTALL_RUST=1`` lets it.
2. It puts the reference plugins (the components of the cdylib crates under ``plugins/``) into
   the package's ``plugins/`` folder, built by ``scripts/build-plugins.sh``, so that a wheel
   built with ``pip install ./crates/python`` finds ``warmup`` and ``codec-top-k`` by name.

``scripts/python-package.sh`` runs this file as a script to put the plugins that the test
command built into the package before its own ``maturin build``:
``python lsgd_torch_build.py stage-plugins [--build]``.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

#: Set to 1 to let maturin download a Rust toolchain when cargo is not on PATH.
OPT_IN = "LSGD_TORCH_INSTALL_RUST"

_CRATE = Path(__file__).resolve().parents[1]
#: The folder the wheel carries the reference plugins in (gitignored; never committed).
PACKAGE_PLUGINS = _CRATE / "python" / "lsgd_torch" / "plugins"
#: The repository root, when this is a checkout.
ROOT = _CRATE.parents[1]

NEEDS = """\
lsgd-torch: cannot build the extension: `cargo` is not on PATH.

Building lsgd-torch from source compiles a Rust extension and the reference plugins:
  - Rust >= 1.95 with cargo (https://rustup.rs), and its wasm32-wasip2 target for the plugins
    (`rustup target add wasm32-wasip2`);
  - a cold release build compiles wasmtime and Cranelift: about 20 minutes on 2 cores
    (one job on a loaded 2-core machine took 21), a few minutes on 16.

Without building it here:
  - from a checkout, `bash scripts/python-package.sh --release DIR` builds a release wheel into
    DIR (then `pip install DIR/lsgd_torch-*.whl`); without --release it builds the development
    wheel the tests use and installs it into the project venv;
  - the test command (`bash scripts/test.sh`) has already built that development wheel, with
    the plugins, into $LSGD_CACHE_ROOT/wheels/ (default ~/.cache/lsgd-host/wheels/):
    `pip install ~/.cache/lsgd-host/wheels/lsgd_torch-*.whl`.

To let maturin download a Rust toolchain (~1.3 GB) into your cache and build anyway, set
{opt_in}=1.
"""


def check_toolchain(which=shutil.which, environ=os.environ):
    """Stops the build, with what it needs, when cargo is missing and the user did not opt in
    to maturin's download of a toolchain."""
    if which("cargo") or environ.get(OPT_IN) == "1":
        return
    # pip shows a failing hook's stderr; the message is the whole of what the user sees.
    sys.stderr.write(NEEDS.format(opt_in=OPT_IN))
    sys.stderr.flush()
    raise SystemExit(1)


def reference_plugins(root=ROOT):
    """The reference plugins' crate names and cargo's target directory: the cdylib crates under
    ``plugins/`` (not the test guests under ``tests/``, nor the libraries)."""
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--no-deps", "--format-version", "1"],
            cwd=root, check=True, capture_output=True, text=True,
        ).stdout
    )
    top = meta["workspace_root"]
    names = sorted(
        p["name"]
        for p in meta["packages"]
        if os.path.relpath(p["manifest_path"], top).split(os.sep)[0] == "plugins"
        and any("cdylib" in t["crate_types"] for t in p["targets"])
    )
    return names, Path(meta["target_directory"])


def stage_plugins(build, root=ROOT, dest=PACKAGE_PLUGINS):
    """Replaces the package's plugins with the reference plugins in ``<target>/plugins``,
    built first by ``scripts/build-plugins.sh`` when ``build``; returns how many."""
    if build:
        done = subprocess.run(
            ["bash", str(root / "scripts" / "build-plugins.sh")],
            cwd=root, stdout=sys.stderr, check=False,
        )
        if done.returncode != 0:
            sys.stderr.write(
                "lsgd-torch: scripts/build-plugins.sh failed (it needs rustup's wasm32-wasip2 "
                "target); using the plugins already in the target directory, if all are there\n"
            )
    names, target = reference_plugins(root)
    built = target / "plugins"
    missing = [n for n in names if not (built / f"{n}.wasm").is_file()]
    if missing:
        sys.stderr.write(
            f"lsgd-torch: no {', '.join(f'{n}.wasm' for n in missing)} in {built}: build the "
            f"reference plugins with `bash scripts/build-plugins.sh` (Rust's wasm32-wasip2 "
            f"target)\n"
        )
        raise SystemExit(1)
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.wasm"):
        old.unlink()
    for n in names:
        shutil.copyfile(built / f"{n}.wasm", dest / f"{n}.wasm")
    return len(names)


def _in_checkout():
    return (ROOT / "scripts" / "build-plugins.sh").is_file()


def _backend():
    import maturin

    return maturin


def _before_wheel():
    check_toolchain()
    if _in_checkout():
        count = stage_plugins(build=True)
        sys.stderr.write(f"lsgd-torch: {count} reference plugins in {PACKAGE_PLUGINS}\n")
    elif not any(PACKAGE_PLUGINS.glob("*.wasm")):
        sys.stderr.write(
            f"lsgd-torch: no reference plugins in {PACKAGE_PLUGINS} and no checkout to build "
            f"them in; the wheel would find plugins only by path or LSGD_PLUGIN_PATH\n"
        )
        raise SystemExit(1)
    sys.stderr.write(
        "lsgd-torch: compiling the extension (release): about 20 minutes on 2 cores when "
        "nothing is compiled yet (pip -v shows its progress)\n"
    )


def get_requires_for_build_wheel(config_settings=None):
    """maturin's requirements, once a toolchain is there or the user opted in."""
    check_toolchain()
    return _backend().get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(config_settings=None):
    """As for a wheel."""
    check_toolchain()
    return _backend().get_requires_for_build_editable(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    """maturin's; an sdist also runs cargo (its metadata)."""
    check_toolchain()
    return _backend().get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    """maturin's metadata."""
    check_toolchain()
    return _backend().prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    """maturin's metadata."""
    check_toolchain()
    return _backend().prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """maturin's release wheel, with the reference plugins in the package."""
    _before_wheel()
    return _backend().build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """maturin's editable wheel, with the reference plugins in the package folder."""
    _before_wheel()
    return _backend().build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    """maturin's sdist (sources only: the plugins are built where the wheel is)."""
    check_toolchain()
    return _backend().build_sdist(sdist_directory, config_settings)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args not in (["stage-plugins"], ["stage-plugins", "--build"]):
        sys.exit(f"usage: {sys.argv[0]} stage-plugins [--build]")
    n = stage_plugins(build="--build" in args)
    print(f"lsgd-torch: {n} reference plugins in {PACKAGE_PLUGINS}", file=sys.stderr)
