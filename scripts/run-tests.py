#!/usr/bin/env python3
"""Runs the test binaries a `cargo test --no-run --message-format=json` build made, as
`cargo test --no-fail-fast` would (each in its package's directory, every binary even when one
fails), but several at once and with each test's time, and writes `NAME<TAB>SECONDS` per test.

Usage: run-tests.py [--jobs=N] [--beside=FILTER…] ARTIFACTS.json TIMES.tsv [-- LIBTEST-ARGS…]
       run-tests.py --slowest N TIMES.tsv [PYTEST-JUNIT.xml]   the N slowest tests of both

The binaries run longest first (by the times of the last run, when TIMES.tsv is there) on
`--jobs` slots (default: the core count), so the one long integration binary starts at once and
the short unit-test binaries fill the other slot beside it. libtest reports times only with
`--report-time`, an unstable flag: it is enabled for the test processes alone
(RUSTC_BOOTSTRAP=1 in their environment, never in a compiler's).

`--beside=FILTER` runs an integration binary's tests that match FILTER in a process of their
own, one at a time, beside the slots and from the start, and skips them in the binary's main
run: for tests that mostly wait (on network timeouts in an emulated cluster), which would
otherwise hold a slot, and so a core, while they sleep.
"""

import json
import os
import re
import subprocess
import sys
import threading
import time

RESULT = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)(?: <([0-9.]+)s>)?")


def binaries(artifacts):
    """(name, executable, package directory) of every test binary the build made."""
    found = []
    with open(artifacts) as f:
        for line in f:
            try:
                m = json.loads(line)
            except json.JSONDecodeError:
                continue
            if m.get("reason") != "compiler-artifact" or not m.get("executable"):
                continue
            if not m["profile"]["test"]:
                continue
            pkg = os.path.dirname(m["manifest_path"])
            name = f'{os.path.basename(pkg)}:{m["target"]["name"]}'
            integration = "test" in m["target"]["kind"]
            found.append((name, m["executable"], pkg, integration))
    return found


def run(binary, extra, lock, times, failures):
    name, exe, pkg, _, filters = binary
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    started = time.monotonic()
    p = subprocess.run(
        [exe, "-Z", "unstable-options", "--report-time", *filters, *extra],
        cwd=pkg,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    wall = time.monotonic() - started
    with lock:
        # One binary's output whole, as cargo prints it, so the closing count can read it.
        print(f"     Running {exe} ({name}, {wall:.0f} s)", flush=True)
        sys.stdout.write(p.stdout)
        sys.stdout.flush()
        for line in p.stdout.splitlines():
            r = RESULT.match(line)
            if r and r.group(3):
                times.append((f"{name}::{r.group(1)}", float(r.group(3))))
        if p.returncode != 0:
            failures.append(f"{name} ({exe}) exited with status {p.returncode}")


def slowest(n, times_file, junit=None):
    """Prints the `n` slowest tests of the cargo times and pytest's JUnit report."""
    rows = []
    for line in open(times_file):
        test, _, secs = line.rstrip("\n").rpartition("\t")
        rows.append((float(secs), test))
    if junit and os.path.exists(junit):
        import xml.etree.ElementTree as ET

        for case in ET.parse(junit).iter("testcase"):
            rows.append((float(case.get("time", 0)), f'pytest:{case.get("classname")}::{case.get("name")}'))
    rows.sort(reverse=True)
    print(f"\nthe {n} slowest tests (seconds):")
    for secs, test in rows[:n]:
        print(f"{secs:8.1f}  {test}")


def main():
    args = sys.argv[1:]
    if args[:1] == ["--slowest"]:
        slowest(int(args[1]), *args[2:])
        return
    extra = []
    if "--" in args:
        at = args.index("--")
        args, extra = args[:at], args[at + 1 :]
    jobs = os.cpu_count() or 2
    beside = []
    while args and args[0].startswith("--"):
        flag, _, value = args.pop(0).partition("=")
        if flag == "--jobs":
            jobs = int(value)
        elif flag == "--beside":
            beside.append(value)
        else:
            sys.exit(f"run-tests: unknown option {flag}")
    artifacts, times_file = args
    todo = binaries(artifacts)
    if not todo:
        sys.exit(f"run-tests: no test binaries in {artifacts}")
    # Each integration binary's main run skips the tests that run beside it.
    skips = [a for f in beside for a in ("--skip", f)]
    todo = [(n, exe, pkg, integration, skips if integration else []) for n, exe, pkg, integration in todo]
    apart = [
        (n, exe, pkg, True, [f, "--test-threads=1"])
        for n, exe, pkg, integration, _ in todo
        if integration
        for f in beside
    ]
    last = {}
    if os.path.exists(times_file):
        for line in open(times_file):
            test, _, secs = line.rstrip("\n").rpartition("\t")
            binary = test.split("::", 1)[0]
            last[binary] = last.get(binary, 0.0) + float(secs or 0)
    # Without times of a last run, integration binaries (the long ones) first.
    todo.sort(key=lambda b: (-last.get(b[0], 0.0), not b[3]))
    lock, times, failures = threading.Lock(), [], []
    pending = list(todo)

    def worker():
        while True:
            with lock:
                if not pending:
                    return
                binary = pending.pop(0)
            run(binary, extra, lock, times, failures)

    threads = [threading.Thread(target=worker) for _ in range(min(jobs, len(todo)))]
    threads += [threading.Thread(target=run, args=(b, extra, lock, times, failures)) for b in apart]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(times_file, "w") as f:
        for test, secs in sorted(times):
            f.write(f"{test}\t{secs:.3f}\n")
    for failure in failures:
        print(f"run-tests: {failure}", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
