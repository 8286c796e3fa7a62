"""docs/fidelity.md names every difference from the official code that a comparison on the
same weights, draws, features and logits measured (issue 42): each one is a table row of
its method's, metric's or score's section that carries the official reference (file:line)
or the option that selects the official behaviour, and the names it uses are registered."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.core.registry import METHODS, METRICS, SCORES

ROOT = Path(__file__).resolve().parents[2]
FIDELITY = ROOT / "docs" / "fidelity.md"

#: (section heading, the row's "what" cell, what the row must carry)
ROWS: list[tuple[str, str, tuple[str, ...]]] = [
    ("cgpt, scgpt", "E term's subtracted part", ("cgp_layer_vit.py:111", "4e-4 to 0.16")),
    ("cgpt, scgpt", '"log joint q" covariance', ("cgp_layer_vit.py:118-123", "`:145`", "3e-9 to 0.5")),
    ("sngp", "power iterations at construction", ("edward2/tensorflow/layers/normalization.py:352", "15")),
    ("sngp", "precision matrix on several devices", ("baselines/jft/sngp.py:448", "summed over the ranks")),
    ("ddu", "power iterations at construction", ("spectral_norm_fc.py:144-146",)),
    ("rff_gp_attention", "jitter floor", ("sgp_layer_rff.py:119", "`jitter = 1e-6`")),
    ("laplace_last_layer", "KFAC of a Linear with bias", ("0.65-2.98 nats", "1.2e-3 to 3.4e-3", '`hessian = "full"`')),
    ("Metrics", "bin sums", ("`ece_torchmetrics`", "calibration_error.py:45-56", "2.5e-5")),
    ("OOD scores", "principal dimension D", ("`vim`", "`residual`", "benchmark.py:230-235")),
    ("OOD scores", "eigenvectors of the covariance",
     ("`vim`", "`residual`", "vim_postprocessor.py:44", "residual_postprocessor.py:51", "12-20 %")),
    ("OOD scores", "fit data and D", ("`residual`", "residual_postprocessor.py:26", "residual.yml", "0.10")),
    ("OOD scores", "precision", ("`mahalanobis`", "`relative_mahalanobis`", "`knn`", "mds_postprocessor.py:60-62",
                                 "rmds_postprocessor.py:60-62", "knn_postprocessor.py:40")),
    ("OOD scores", "classes", ("`mahalanobis`", "mds_postprocessor.py:17", "NaN")),
    ("OOD scores", "parameter choice", ("`energy`", "`knn`", "`vim`", "evaluator.py:154-157", "ebo.yml", "knn.yml",
                                        "vim.yml")),
]

#: the sections whose first column names the metric or score a row is about, and its registry
NAMED_IN_ROWS = {"Metrics": METRICS, "OOD scores": SCORES}


def sections(text: str) -> dict[str, str]:
    """``## heading`` -> the text up to the next ``## `` heading."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {heading.strip(): body for heading, body in zip(parts[1::2], parts[2::2])}


def table_rows(body: str) -> list[list[str]]:
    """The cells of every Markdown table row of ``body`` (header and rule rows included)."""
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in body.splitlines() if line.startswith("|")]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces -> -."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


@pytest.fixture(scope="module")
def doc() -> dict[str, str]:
    return sections(FIDELITY.read_text(encoding="utf-8"))


@pytest.mark.parametrize("section,what,refs", ROWS, ids=[f"{s}: {w}" for s, w, _ in ROWS])
def test_each_measured_difference_is_a_row_with_its_official_reference(doc, section, what, refs):
    assert section in doc, f"docs/fidelity.md has no section '## {section}'"
    rows = [" | ".join(cells) for cells in table_rows(doc[section]) if what in cells]
    assert len(rows) == 1, f"section '{section}' has {len(rows)} rows about {what!r}"
    missing = [ref for ref in refs if ref not in rows[0]]
    assert not missing, f"the row {what!r} of '{section}' lacks {missing}"


def test_the_names_the_sections_use_are_registered(doc):
    """A section heading names methods; the first column of the metric and score tables
    names metrics and OOD scores: each name must be a registered one."""
    for section in {s for s, _, _ in ROWS} - set(NAMED_IN_ROWS):
        for name in section.split(", "):
            assert name in METHODS, f"'## {section}' names {name!r}, not a method"
    for section, registry in NAMED_IN_ROWS.items():
        first = [cells[0] for cells in table_rows(doc[section])[2:]]
        names = {name for cell in first for name in re.findall(r"`(\w+)`", cell)}
        assert names, section
        unknown = sorted(name for name in names if name not in registry)
        assert not unknown, f"'## {section}' names {unknown}, not registered {registry.kind}s"


def test_links_to_sections_of_the_page_name_a_heading(doc):
    """README.md's links to ``docs/fidelity.md#...`` and the page's own ``(#...)`` links."""
    anchors = {slug(heading) for heading in doc}
    links = re.findall(r"fidelity\.md#([\w-]+)", (ROOT / "README.md").read_text(encoding="utf-8"))
    links += re.findall(r"\]\(#([\w-]+)\)", FIDELITY.read_text(encoding="utf-8"))
    assert links
    assert not sorted(set(links) - anchors), f"links to no heading: {sorted(set(links) - anchors)}"
