"""The commands that describe a suite or a run (``bench/run/commands/``): ``list --suite``
names every method of a suite, derived ones included, and what each is computed from;
``status`` names the derived methods of the run after its cells."""
from __future__ import annotations

import tomllib

from bench.run.cli import main
from bench.config.spec import SUITES_DIR
from tests.helpers.synthetic import fake_store, fake_suite


def _entries(out: str) -> dict[str, str]:
    """``  name  text`` lines -> {name: text}."""
    return {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}


def test_list_suite_names_every_method_of_the_suite_derived_ones_included(capsys):
    assert main(["list", "--suite", "zoo"]) == 0
    out = capsys.readouterr().out
    planned = tomllib.loads((SUITES_DIR / "zoo.toml").read_text())["methods"]
    entries = _entries(out)
    assert list(entries) == list(planned), out  # every method, in the suite's order
    assert "derived" in entries["deep_ensemble"] and "3 seeds of msp" in entries["deep_ensemble"], out
    assert "post hoc" in entries["laplace_last_layer"] and "msp's cell" in entries["laplace_last_layer"], out
    file = tomllib.loads((SUITES_DIR / "zoo.toml").read_text())
    kep_epochs = planned["kep_svgp"].get("train", {}).get("epochs", file["train"]["epochs"])  # the suite file's, read here
    assert f"trained: {kep_epochs} epochs" in entries["kep_svgp"] and "starting from msp's cell" in entries["cgpt"], out
    assert "seeds: 0, 1, 2" in out and "datasets: mnist5k" in out


def test_list_suite_of_an_unknown_suite_is_one_line_with_did_you_mean(capsys):
    assert main(["list", "--suite", "zo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'zoo'?" in err, err


def test_status_names_the_derived_methods_after_the_cells(tmp_path, capsys):
    suite = tmp_path / "st.toml"
    suite.write_text(fake_suite("st", "[methods.temperature_scaling]\nbase = \"msp\"\n"
                                      "[methods.deep_ensemble]\nbase = \"msp\"\nmembers = 2\n"))
    fake_store(tmp_path / "results", suite)
    assert main(["status", "--suite", str(suite), "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    derived = out.split("derived methods", 1)[1]
    assert "temperature_scaling" in derived and "deep_ensemble" in derived and "2 seeds of msp" in derived, out


def test_status_of_a_finished_run_lists_its_cells_and_says_nothing_is_left(tiny_store, capsys):
    """``status NAME`` of a run whose cells are all done names each of them, with what it
    cost, and says nothing is left to run (not 'the time left for the 0 cell(s)')."""
    import json

    assert main(["status", "hard", "--results", str(tiny_store / "results")]) == 0
    out = capsys.readouterr().out
    for cell in json.loads((tiny_store / "results" / "hard" / "run.json").read_text())["cells"]:
        assert f"{cell['dataset']} / {cell['method']} / seed {cell['seed']}: done in " in out and cell["key"] in out, out
    assert "2 done" in out and "nothing left to run" in out and "0 cell(s)" not in out, out


def test_the_time_left_is_each_pending_cell_at_its_methods_measured_cost():
    from bench.core.progress import time_left

    measured = {"msp": [10.0, 20.0], "kep_svgp": [100.0]}
    assert time_left(["msp", "msp", "kep_svgp"], measured) == 15 + 15 + 100
    assert time_left(["sgpa"], measured) == (10 + 20 + 100) / 3  # not measured yet: the mean of every cell
    assert time_left(["msp", "kep_svgp"], measured, parallel=2) == (15 + 100) / 2
    assert time_left(["msp"], {}) != time_left(["msp"], {})  # NaN: nothing measured yet
    assert time_left([], {}) == 0.0
