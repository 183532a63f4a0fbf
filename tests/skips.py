"""Every skip is a decision: the reasons a run may skip for are listed here, and `make test` fails on any other.

At the end of every run the skips are counted by reason. Where AUDIOPIPE_SYSDEPS is set (`make test`, after
`make sysdeps` and `make upstream`: nothing the suite reads is missing), a skip whose reason matches none of
ALLOWED makes the run fail (exit status 1), listing the tests. A new optional test therefore says why it may skip
by adding its reason here. tests/conftest.py imports the hooks.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

# a substring of the skip reason -> why that skip is allowed on a machine with everything installed
ALLOWED = {
    "no CUDA device here": "tests/test_cuda.py runs on a GPU (benchmarks/gpu_proof.py runs it there)",
    "the host clock has no device queue": "a CUDA-only test, when tests/test_cuda.py runs on the CPU",
    "AUDIOPIPE_AMPHION_SRC": "opt-in oracle: Amphion's source is not on a package registry (test_checkpoint_ns2)",
    "AUDIOPIPE_F5_FULL_BASE": "opt-in oracle: F5TTS_v1_Base at full size, ~8 GB (test_checkpoint_f5tts)",
    "AUDIOPIPE_GPT_SOVITS_SRC": "opt-in oracle: GPT-SoVITS's v2 Chinese front end is not on a package registry "
                                "(test_text_zh_oracle)",
}

_skipped: list[tuple[str, str]] = []  # (test id, reason) in the order they came


def allowed(reason: str) -> bool:
    return any(k in reason for k in ALLOWED)


def _reason(report) -> str:
    lr = report.longrepr
    text = lr[2] if isinstance(lr, tuple) else str(lr)
    return text.removeprefix("Skipped: ")


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append((report.nodeid, _reason(report)))


def pytest_collectreport(report):
    if report.skipped:
        _skipped.append((report.nodeid, _reason(report)))


def _controller(config) -> bool:
    return not hasattr(config, "workerinput")  # under pytest-xdist the workers' reports reach the controller


def _strict() -> bool:
    return bool(os.environ.get("AUDIOPIPE_SYSDEPS"))


def pytest_sessionfinish(session, exitstatus):
    if _controller(session.config) and _strict() and any(not allowed(r) for _, r in _skipped):
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _controller(config) or not _skipped:
        return
    tr = terminalreporter
    by_reason = Counter(r for _, r in _skipped)
    tr.write_sep("-", f"{len(_skipped)} skipped, by reason")
    for reason, n in by_reason.most_common():
        tr.write_line(f"{n:4d}  {'allowed' if allowed(reason) else 'fails make test'}: {reason}")
    bad = [(t, r) for t, r in _skipped if not allowed(r)]
    if bad and _strict():
        tr.write_line(f"FAILED: {len(bad)} tests skipped for a reason tests/skips.py does not allow "
                      "(AUDIOPIPE_SYSDEPS is set: everything they need should be installed):", red=True)
        for t, r in bad:
            tr.write_line(f"  {t}: {r}")
