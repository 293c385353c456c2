"""``tests/slow_by_measured_time.txt`` names only tests that exist: a renamed or removed test
would otherwise fall back into the default suite (or out of every run) without a word."""

import subprocess
import sys

from conftest import ROOT, SLOW_BY_MEASURED_TIME


def test_every_listed_test_is_collected_and_marked_slow():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-m",
            "slow",
            "-p",
            "no:cacheprovider",
            "tests",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    collected = {
        line.strip().removeprefix("tests/") for line in done.stdout.splitlines() if "::" in line
    }
    missing = sorted(SLOW_BY_MEASURED_TIME - collected)
    assert not missing, f"tests/slow_by_measured_time.txt names tests that do not exist: {missing}"
    assert len(SLOW_BY_MEASURED_TIME) > 50  # the list was read, not silently empty
