"""The repository's ``.gitignore``: a run's report is git-ignored unless it is one of the
committed reference reports, so a quick try (``reports/try1/``) leaves ``git status``
clean; the reference reports, and every file git tracks under ``reports/``, are not."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.helpers import REPO

REFERENCES = ("default", "zoo", "variants", "text", "cifar10_subset", "perf")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module", autouse=True)
def in_a_git_checkout():
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout (e.g. an unpacked archive): nothing to ignore")


def ignored(path: str) -> bool:
    return _git("check-ignore", "-q", "--no-index", path).returncode == 0


@pytest.mark.parametrize("run", ["try1", "default-epochs1-a3f9", "default+metrics-ece", ".default.previous"])
def test_the_report_of_a_run_of_ones_own_is_ignored(run):
    assert ignored(f"reports/{run}/README.md")
    assert ignored(f"reports/{run}/plots/training_mnist5k.png")


@pytest.mark.parametrize("run", REFERENCES)
def test_the_reference_reports_are_not_ignored(run):
    assert not ignored(f"reports/{run}/README.md")
    assert not ignored(f"reports/{run}/tables/summary.md")


def test_no_tracked_file_is_ignored_and_the_analysis_cache_is():
    assert _git("ls-files", "-ci", "--exclude-standard", "reports").stdout == ""
    assert ignored("reports/default/analysis/cache/0123abcd/analysis.json")
