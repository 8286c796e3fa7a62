"""The analysis files as a cache (``bench/analysis/files.py``): one result set kept per
store content, so reporting another store into the same report folder and coming back
recomputes nothing; a plugin's changed code (its helpers' included) is never served from
the cache."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.run.cli import main


def _report(tiny_store: Path, results: Path, reports: Path, capsys) -> str:
    """``run_suite.py report`` of the tiny suite on the store under ``results``; its stderr."""
    code = main(["report", "--suite", str(tiny_store / "hard.toml"), "--results", str(results),
                 "--reports", str(reports)])
    assert code == 0
    return capsys.readouterr().err


def test_switching_stores_a_b_a_reuses_the_analysis_of_a(tiny_store, tmp_path, capsys):
    a, b, reports = tmp_path / "a", tmp_path / "b", tmp_path / "reports"
    shutil.copytree(tiny_store / "results", a)
    shutil.copytree(tiny_store / "results", b)
    seed1 = next(d for d in (b / "hard").iterdir()
                 if (d / "cell.json").is_file() and json.loads((d / "cell.json").read_text())["seed"] == 1)
    from bench.store import CellDir

    cell = CellDir(seed1)  # store b: the same cells, seed 1's test predictions in reverse order: other content
    preds = cell.read_preds("test")
    cell.write_preds("test", preds.map(lambda a: a[::-1].copy()))
    cell.seal(cell.read_cell())
    analysis = reports / "hard" / "analysis"

    assert "(analysed the store;" in _report(tiny_store, a, reports, capsys)
    key_a = json.loads((analysis / "analysis.json").read_text())["key"]
    metrics_a = (analysis / "metrics.csv.gz").read_bytes()
    written_a = (analysis / "metrics.csv.gz").stat().st_mtime_ns

    assert "(analysed the store;" in _report(tiny_store, b, reports, capsys)
    key_b = json.loads((analysis / "analysis.json").read_text())["key"]
    assert key_b != key_a

    assert "(reused the analysis files;" in _report(tiny_store, a, reports, capsys)
    assert json.loads((analysis / "analysis.json").read_text())["key"] == key_a
    assert (analysis / "metrics.csv.gz").read_bytes() == metrics_a
    assert (analysis / "metrics.csv.gz").stat().st_mtime_ns == written_a  # the file written by a's first report
    assert [p.name for p in (analysis / "cache").iterdir()] == [key_b[:16]]  # b's set, kept in turn

    assert "(reused the analysis files;" in _report(tiny_store, b, reports, capsys)
    assert json.loads((analysis / "analysis.json").read_text())["key"] == key_b


PLUGIN = '''"""A user's plugin score whose sign comes from a helper module beside it."""
import numpy as np

from {helper} import SIGN


def signed_msp(preds, _fitted=None):
    return SIGN * np.exp(np.asarray(preds.log_probs, np.float64)).max(axis=1)
'''


@pytest.mark.parametrize("helper", ["plug_43.sign", ".sign"])
def test_a_plugin_score_whose_helper_changed_is_analysed_again(tmp_path, monkeypatch, helper):
    """A plugin score (a package ``plug_43``: the score in one module, its sign in another,
    imported by its absolute or its relative name):
    the analysis files are reused while nothing changed, and recomputed with the new values
    once the helper module changes (as a new ``report`` process would import it), never
    served stale from the cache."""
    import importlib
    import sys

    import numpy as np

    from bench.analysis import analyse_store
    from bench.store.catalog import open_store
    from bench.core.registry import SCORES
    from bench.scores.record import Score
    from tests.helpers.synthetic import fake_store, fake_suite

    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # the edited helper is read again, not its .pyc
    package = tmp_path / "plugins" / "plug_43"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sign.py").write_text("SIGN = 1.0\n")
    (package / "score.py").write_text(PLUGIN.format(helper=helper))
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    for name in ("plug_43", "plug_43.sign", "plug_43.score"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    score = importlib.import_module("plug_43.score")
    monkeypatch.setitem(SCORES._items, "test_signed_msp", Score("test_signed_msp", score.signed_msp, "signed",
                                                                "MSP times the helper's sign.", ("log_probs",)))
    suite = tmp_path / "plug.toml"
    suite.write_text(fake_suite("plug"))
    fake_store(tmp_path / "results", suite)
    out = tmp_path / "analysis"

    def auroc() -> tuple[float, bool]:
        catalog = open_store(tmp_path / "results" / "plug")
        results, reused = analyse_store(catalog, out, ["ood_auroc"], resamples=20, scores=["test_signed_msp"])
        m = results.metrics
        return float(m[(m.metric == "ood_auroc") & (m.seed == 0)]["value"].iloc[0]), reused

    first, reused = auroc()
    assert not reused and auroc() == (first, True)
    (package / "sign.py").write_text("SIGN = -1.0\n")  # the helper changed; the score's own module did not
    importlib.reload(sys.modules["plug_43.sign"])
    importlib.reload(score)  # what a new process imports: the score reads the new sign
    monkeypatch.setitem(SCORES._items, "test_signed_msp", Score("test_signed_msp", score.signed_msp, "signed",
                                                                "MSP times the helper's sign.", ("log_probs",)))
    second, reused = auroc()
    assert not reused and np.isclose(second, 1.0 - first) and not np.isclose(first, 0.5)


SIDE_EFFECT = 'from pathlib import Path\n\nPath(__file__).with_name("imported").write_text("yes")\n'


def test_module_digests_imports_no_package_of_a_plugin_and_follows_its_helpers(tmp_path, monkeypatch):
    """A plugin's score (``side_41.inner.score``, loaded from its file alone) imports its
    helpers inside the function, by absolute and by relative name: the digests cover the
    helpers without importing a package on the way (each ``__init__`` writes a file when
    it runs), and change when a helper's source changes."""
    import importlib.util
    import sys

    from bench.analysis.files import module_digests

    root = tmp_path / "plugins"
    inner = root / "side_41" / "inner"
    inner.mkdir(parents=True)
    for package in (root / "side_41", inner):
        (package / "__init__.py").write_text(SIDE_EFFECT)
    (inner / "helper.py").write_text("SIGN = 1.0\n")
    (inner / "scale.py").write_text("SCALE = 2.0\n")
    (inner / "score.py").write_text(
        "def score(x):\n"
        "    from side_41.inner.helper import SIGN\n"
        "    from .scale import SCALE\n"
        "    return SIGN * SCALE * x\n")
    monkeypatch.syspath_prepend(str(root))
    for name in ("side_41", "side_41.inner", "side_41.inner.helper", "side_41.inner.scale", "side_41.inner.score"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    spec = importlib.util.spec_from_file_location("side_41.inner.score", inner / "score.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "side_41.inner.score", module)
    spec.loader.exec_module(module)

    before = module_digests([module.score])
    assert {"side_41.inner.score", "side_41.inner.helper", "side_41.inner.scale"} <= set(before)
    assert not any((p / "imported").exists() for p in (root / "side_41", inner))
    assert "side_41" not in sys.modules and "side_41.inner" not in sys.modules

    (inner / "helper.py").write_text("SIGN = -1.0\n")
    after = module_digests([module.score])
    assert after["side_41.inner.helper"] != before["side_41.inner.helper"]
    assert after["side_41.inner.scale"] == before["side_41.inner.scale"]
