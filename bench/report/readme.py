"""The report's ``README.md``: the cells it leaves out (only when there are any: the
*Incomplete* banner of a ``--partial`` report), the cells
still improving when their training ended or not learning, notes (not in an incomplete report),
conventions (from the registered metrics), every table of each dataset, failed cells, the plots, and a footnote per method
that differs from its authors' code."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pandas as pd
from tabulate import tabulate

from bench.analysis import IMPROVING, NOT_LEARNING, RULE, UNJUDGED
from bench.data import is_ood
from bench.core.registry import SCORES
from bench.report.formats import md_escape, to_markdown
from bench.report.plots import SMALL_SPLIT
from bench.scores import default_scores, sort_scores
from bench.report.tables import IMPROVING_MARK, NOT_REACHED, TABLES, Column, Table, dataset_columns
from bench.analysis.bootstrap import SAMPLES_SEEDS_FIXED

if TYPE_CHECKING:
    from bench.analysis import AnalysisResults
    from bench.store.catalog import LeftOut

NOTES = "NOTES.md"  # written by hand, never by the report: inlined at the top of README.md (not of an incomplete one)


@dataclass(frozen=True)
class RunTitle:
    """Which run a report shows, for its title, the line under it and its plots' titles:
    the run's ``name`` and ``suite``, its plan overrides as command-line flags
    (``overrides``, "" for none), what this report narrows or adds (``shown``: e.g.
    ``--methods msp --metrics ece``), when the run started (``date``, ``YYYY-MM-DD``, or
    when its newest cell finished: ``finished``; "" when unknown)."""

    name: str
    suite: str
    overrides: str = ""
    shown: str = ""
    date: str = ""
    finished: str = ""

    @property
    def reference(self) -> bool:
        """The suite's own run: its name, nothing overridden (a committed reference report)."""
        return self.name == self.suite and not self.overrides

    def lines(self) -> list[str]:
        """The README's line under the title."""
        what = f"suite `{self.suite}` with `{self.overrides}`" if self.overrides else \
            f"suite `{self.suite}` with no overrides"
        when = f", started {self.date}" if self.date else f", its last cell finished {self.finished}" \
            if self.finished else ""
        if self.reference:
            verdict = "the suite's reference run (its file's plan, nothing overridden)."
        elif self.overrides:
            verdict = ("**not the suite's reference run**: its overrides change what was trained, so its numbers "
                       f"are not those of suite `{self.suite}`.")
        else:
            verdict = "the suite's plan, nothing overridden, under a name of its own."
        line = f"Run `{self.name}`: {what}{when}; {verdict}"
        if self.shown:
            line += f" This report shows `{self.shown}` of it."
        return [line, ""]


def _marks_note(significance: str) -> str:
    """What a mark and an interval mean, for the test the analysis used."""
    if significance == SAMPLES_SEEDS_FIXED:
        return (
            "A mark `▲`/`▼` means that the method is better/worse than the reference (in the "
            "metric's good direction) beyond the noise of the test samples alone, the trained "
            "seeds held fixed (`--significance samples_seeds_fixed`: a paired bootstrap z-test, "
            "the difference over the standard deviation of its bootstrap distribution on the "
            "same resampled samples, Holm-corrected across the comparisons of one dataset's "
            "table, p_holm < 0.05); it ignores seed-to-seed variation, so a re-run with new seeds "
            "need not repeat it. `[lo, hi]` is the percentile bootstrap interval over test "
            "samples (at the estimate's decimals, rounded outward). "
        )
    return (
        "**A mark `▲`/`▼` means that the method is better/worse than the reference, in the "
        "metric's good direction, by more than re-training both with new seeds and re-drawing "
        "the test set would produce by chance (p_holm < 0.05).** The test adds the spread of "
        "the per-seed values (s²/S; of the per-seed differences where both methods were "
        "trained from the same seeds) to the test images' shared part of the paired bootstrap "
        "variance over test samples (1,000 resamples), and refers the observed difference (no "
        "bootstrap bias correction: two equal methods share their bias) to a t "
        "distribution with S - 1 degrees of freedom; Holm-corrected "
        "across the comparisons of one dataset's table (the KEP-SVGP paper's metrics as one "
        "family, any other metric as another). `△`/`▽`: the same test where one side is a "
        "single run (one seed, or an ensemble with one replicate), whose seed variation "
        "cannot be measured; the mark then rests on test-sample noise (and the other side's "
        "seeds) only, and a re-run with new seeds may not repeat it. `[lo, hi]` "
        "(at the estimate's decimals, rounded outward) is the 95% interval of the seed-mean built the same way "
        "(test samples only for a single run), cut to the metric's range (e.g. [0, 100] for a "
        "percentage). An interval is for the metric's true value: for "
        "an estimator biased upward, as plug-in ECE is, it can lie below the estimate. "
        "`≈[lo, hi]` marks a metric whose intervals are "
        "only approximate, as *Conventions* says (the calibration errors). The coverage of "
        "these intervals and the false-positive rate of the marks are measured by simulation "
        "in `reports/perf/coverage.md` (`benchmarks/coverage.py`): 94-100% coverage and 2-7% "
        "false marks per metric for accuracy, NLL and AURC with 3 or 5 seeds (at most 5% for a "
        "table's family after Holm); for two single runs of identical methods, hollow marks fired "
        "in 21% of cases. A mark needs a large difference: with 3 seeds (t on 2 df) and a family "
        "of 60 comparisons, 35 standard errors of the difference. *Seeds needed* gives, per "
        "comparison, the seeds per method at which a true difference of the observed size "
        "would be marked (p < 0.05/m in its table's Holm family of m) with 80% power at the "
        "measured variances (the seed spread's standard deviation taken as s / c4, without bias) "
        f"(`{NOT_REACHED}`: more seeds alone would not do; `n/a`: a side with one run). "
    )


def _note(reference: str, significance: str) -> str:
    ref = f"`{reference}`" if reference else "(none: no marks)"
    return (
        f"Reference method: {ref}. Cells are mean ± std over seeds (std with ddof=1; a single "
        "seed shows the mean only) at the scale in each column header (see *Conventions*). "
        "For ensembles the \"seeds\" are replicates (independent draws of member seeds). "
        + _marks_note(significance) +
        "The severity table averages each metric over the corruptions "
        "evaluated at a severity; its severity 0 is the same samples clean (a corruption split "
        "holds the first N test samples, corrupted; *Samples* gives N), so every row compares the "
        "same samples; its CI (`ci_low`/`ci_high` in the CSV, the band of the "
        "severity plots, `≈` where approximate) is the analysis' 95% interval of that seed-mean, built as above; a "
        "binned calibration error on splits of few samples is biased upward (the severity plots say so below "
        f"{SMALL_SPLIT:,} samples), so its severity 0 can exceed the summary's value on the whole test split. `n/a` means the metric "
        "is undefined for every "
        "seed (e.g. failure AUROC when all predictions are correct) and `failed` that no "
        "seed of the method finished (see *Failed cells*). LaTeX (`tables/*.tex`, "
        "booktabs): best value per column in bold within each dataset and "
        "split/score/severity/corruption group, marks as `$^\\uparrow$`/`$^\\downarrow$` "
        "(one run: `$^{(\\uparrow)}$`/`$^{(\\downarrow)}$`). "
        "Machine-readable raw (unscaled) values: `tables/*.csv`, with `<metric>_mean`, "
        "`_std`, `_ci_low`, `_ci_high`, `_p_holm`, `_verdict`, `_test` per metric (severity `-1` = "
        "every corruption split). Every number of these tables comes from the analysis files "
        "in `analysis/` (tidy CSV: `metrics.csv.gz` per dataset, method, seed, split, metric "
        "and score; `summary.csv` with mean, std, CI, p-values and seeds needed; `training.csv`, "
        "`convergence.csv` and `convergence_summary.csv` with the training logs, below; "
        "`analysis.json` with the options and the store fingerprint they were computed from)."
    )


CONVERGENCE_NOTE = (
    "*Convergence* (a table per data set; the training curves are among the *Plots*): per method and "
    "training stage, the last epoch of the training logs (mean over seeds), the epoch whose weights the "
    "cell kept, and in how many seeds the model was still improving when its training ended, by this "
    f"rule: {RULE}. A method with such a seed (still improving or not learning), or whose base has one, carries "
    f"`{IMPROVING_MARK.strip()}` after its name in the summary and convergence tables: its numbers come from a model "
    "that had not converged or had not learned, and are a finding about the training budget (or the training) "
    "rather than about the method; the *Still improving* column counts the seeds still improving and, as `m of n "
    "not learning`, those not learning. A post-hoc "
    "method (last-layer Laplace on msp's network) and a derived one (temperature scaling, ensembles) "
    "show the logs of their base (`base msp`); a two-stage method (CGPT fine-tuned from msp) has a row "
    "per stage, stage 1 its base's cell of the same seed and stage 2 its own log. Machine-readable: "
    "`analysis/training.csv` (one row per dataset, method, seed and epoch of every cell that trained: "
    "`stage, epoch, lr, train_loss, train_acc, val_acc, val_nll, seconds`; a two-stage cell's rows are its "
    "stage 2), `analysis/convergence.csv` (one row per cell and stage: `source`, the method whose log it "
    "is, the last epoch's values, `best_epoch`, the compared windows' `window` (k), `train_acc_rise` and "
    "`val_nll_drop`, the most frequent test label's share `majority_share`, and the `verdict`: `improving`, "
    "`not learning`, `not improving` or `n/a: why`) and "
    "`analysis/convergence_summary.csv` (one row per method and stage: the means over seeds, `n_seeds`, "
    "`n_flagged` (still improving or not learning), `n_not_learning`, `n_unjudged` and why)."
)


def _convergence_header(results: AnalysisResults, methods: list[str], flagged: set[tuple[str, str]]) -> list[str]:
    """The README's opening statement on convergence: the cells whose training log was still
    improving at its end and those not learning, each kind named (each log once, with its
    seeds: a stage-1 cell that a post-hoc, two-stage or derived method shares with its base
    is its base's), the method rows marked for them, and the cells that could not be judged (``n/a: 1 epoch``); that none was, when
    none was; nothing when the shown methods have no training log."""
    summary = results.convergence_summary
    mine = summary[summary["method"].isin(methods)] if len(summary) else summary
    if not len(mine):
        return []
    used = set(mine[["dataset", "source", "stage"]].itertuples(index=False, name=None))
    cells = results.convergence
    logs = cells[[k in used for k in cells[["dataset", "source", "stage"]].itertuples(index=False, name=None)]]
    logs = logs.drop_duplicates(["dataset", "source", "stage", "seed"])

    def listed(rows: pd.DataFrame, why: bool = False) -> str:
        groups: dict[tuple, list[str]] = {}
        for d, source, stage, seed, verdict in rows[["dataset", "source", "stage", "seed", "verdict"]].itertuples(
                index=False, name=None):
            log = f"{d} / {source}{' (stage 2)' if stage > 1 else ''}"
            groups.setdefault((log, verdict[len(UNJUDGED):] if why else ""), []).append(str(seed))
        return "; ".join(f"{log}, seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}{f' ({why})' if why else ''}"
                         for (log, why), seeds in groups.items())

    improving = logs[logs["verdict"] == IMPROVING]
    stuck = logs[logs["verdict"] == NOT_LEARNING]
    unjudged = logs[logs["verdict"].str.startswith(UNJUDGED)]
    mark = IMPROVING_MARK.strip()
    if len(improving) or len(stuck):
        marked = ", ".join(f"{m} ({d})" if len(results.datasets) > 1 else m
                           for d in results.datasets for m in methods if (d, m) in flagged)
        kinds = [(name, rows, why) for name, rows, why in (("still improving", improving, "had not converged"),
                                                          ("not learning", stuck, "had not learned")) if len(rows)]
        title = " or ".join(name for name, _, _ in kinds).capitalize()
        cause = " or ".join(why for _, _, why in kinds)
        cells = (f": {md_escape(listed(kinds[0][1]))}." if len(kinds) == 1 else  # both kinds: each named
                 "." + "".join(f" {name.capitalize()}: {md_escape(listed(rows))}." for name, rows, _ in kinds))
        parts = [f"**{title} when training ended** (the rule is under *Convergence* in the note below){cells} "
                 f"Marked `{mark}` in the summary and convergence tables: {md_escape(marked)}; their numbers come "
                 f"from models that {cause}."]
    elif len(unjudged) < len(logs):
        parts = ["**Convergence**: no training log was still improving when training ended (the rule is under "
                 "*Convergence* in the note below)."]
    else:
        return [f"**Convergence** could not be judged for any training log: {md_escape(listed(unjudged, why=True))}.",
                ""]
    if len(unjudged):
        parts[0] += f" Not judged: {md_escape(listed(unjudged, why=True))}."
    return parts + [""]


def _scores_note(results: AnalysisResults, methods: list[str]) -> list[str]:
    """The OOD scores of the *Score* column (the analysed ones, from the registry), and the
    selected scores a shown method could not get, with the reason."""
    names = sort_scores(results.scores)
    parts = ["OOD scores (column *Score*; higher = more in-distribution; `--scores` picks them, "
             f"default: {', '.join(f'`{n}`' for n in default_scores())}):", ""]
    body = []
    for name in names:
        score = SCORES.get(name) if name in SCORES else None
        if score is None:
            body.append([f"`{name}`", "", "(not registered in this code)", ""])
            continue
        body.append([f"`{name}`", ", ".join(score.needs), md_escape(score.convention), md_escape(score.reference)])
    parts.append(tabulate(body, headers=["Score", "Needs", "Convention", "Reference"], tablefmt="pipe",
                          disable_numparse=True) + "\n")
    shown = set(methods)
    missing = results.unscored.loc[results.unscored["method"].isin(shown)] if len(results.unscored) else results.unscored
    if len(missing):
        parts += ["Scores not computed (the store lacks what they need):", ""]
        rows = [[md_escape(str(v)) for v in row] for row in missing[["dataset", "method", "score", "reason"]]
                .itertuples(index=False)]
        parts.append(tabulate(rows, headers=["dataset", "method", "score", "reason"], tablefmt="pipe",
                              disable_numparse=True) + "\n")
    return parts


DEGENERATE_NOTE = (
    "Degenerate splits, where peers disagree. Here an undefined value is NaN (`n/a`): with "
    "no error, failure AUROC, FPR95 and AUPR-E (AUPR-S = 1); with no correct prediction, "
    "failure AUROC, FPR95 and AUPR-S (AUPR-E = 1, AURC = 1, E-AURC = 0), Cov@5Risk = NaN; "
    "`rms_ce_adaptive100` below 100 samples. The peers: KEP-SVGP/OpenMix give AUROC and FPR95 "
    "NaN without errors, but with every prediction wrong FPR95 0.0, AUPR-S 0.5 and E-AURC NaN "
    "(log 0); fd-shifts turns undefined values into NaN, and with every prediction correct its "
    "ECE uses the wrong class (mean confidence instead of 1 - mean confidence); "
    "TorchUncertainty gives AURC 0 / 1 and Cov@5Risk NaN (all wrong), FPR95 NaN without OOD "
    "samples and aECE NaN for N < 15 (0 here); torchmetrics' AUROC gives 0.0 for one class; "
    "scikit-learn >= 1.6 `roc_auc_score` gives NaN (earlier versions raise); Hendrycks' "
    "`calib_err` crashes below 100 samples. OOD scores all tied: AUROC 0.5, FPR95 1.0 here and "
    "in OpenOOD, TorchUncertainty and Hendrycks' code."
)


def _conventions(tables: list[Table], results: AnalysisResults, methods: list[str]) -> list[str]:
    """One line per shown column (metrics first seen order), with its convention."""
    seen: dict[str, tuple[Column, list[str]]] = {}
    for table in tables:
        for col in table.columns:
            seen.setdefault(col.key, (col, []))[1].append(table.spec.name)
    body = [[md_escape(col.header), f"`{key}`", ", ".join(names),
             md_escape(col.convention + (f" {col.interval}" if col.interval else ""))]
            for key, (col, names) in seen.items()]
    parts = ["## Conventions", ""]
    if body:
        parts.append(tabulate(body, headers=["Column", "Name", "Tables", "Convention"],
                              tablefmt="pipe", disable_numparse=True) + "\n")
    if any(t.spec.source == "ood" for t in tables):
        parts += _scores_note(results, methods)
    if any(t.metric_columns for t in tables):
        parts += [DEGENERATE_NOTE, ""]
    return parts


def readme_text(
    results: AnalysisResults,
    methods: list[str],
    tables: list[Table],
    plots: list[tuple[str, str, Path]],
    out_dir: Path,
    severity: int,
    left_out: Sequence[LeftOut] = (),
    complete_with: str = "",
    run: RunTitle | None = None,
) -> str:
    """The README; ``run`` names the run in the title and the line under it (None: the
    suite's name alone, a report made without a run)."""
    parts = [f"# uqbench report: {run.name if run is not None else results.suite}", ""]
    parts += run.lines() if run is not None else []
    parts += _left_out(left_out, complete_with)
    parts += _convergence_header(results, methods, set().union(*(t.flagged for t in tables)))
    parts += _hand_notes(out_dir, bool(left_out))
    parts += [_note(results.reference, results.significance), "", CONVERGENCE_NOTE, ""]
    fidelity, footnotes = _fidelity(results, methods)
    parts += fidelity
    shown = {t.spec.name for t in tables}
    skipped = [s.name for s in TABLES if s.name not in shown]
    if skipped:
        parts += [f"Not shown (none of the selected metrics belongs to them): {', '.join(skipped)}.", ""]
    parts += _conventions(tables, results, methods)
    for dataset in results.datasets:
        parts += _dataset_section(results, methods, tables, dataset, severity)
    parts += _failed_and_damaged(results, methods)
    parts += _plots_section(results, plots, out_dir)
    parts += footnotes
    return "\n".join(parts).rstrip("\n") + "\n"


def _hand_notes(out_dir: Path, incomplete: bool) -> list[str]:
    """The run's hand-written discussion (:data:`NOTES` in ``out_dir``, e.g. a comparison
    with a paper), or, in an ``incomplete`` report, a line saying it is left out (it was
    written for the run's complete report)."""
    notes = out_dir / NOTES
    if notes.is_file() and incomplete:
        return [f"*`{NOTES}`, written by hand, describes the complete run: it is left out of this incomplete "
                "report.*", ""]
    if notes.is_file():
        return [notes.read_text(encoding="utf-8").strip(), ""]
    return []


def _dataset_section(results: AnalysisResults, methods: list[str], tables: list[Table], dataset: str,
                     severity: int) -> list[str]:
    """A data set's section: its protocol note, then each table's rows of it (a table too
    long for the README is named instead), the still-improving mark's legend where a row
    carries it, and under the OOD table the best scores and the near/far OOD groups."""
    parts = [f"## {dataset}", ""]
    if results.notes.get(dataset):  # the data set's protocol (registered class's report_note)
        parts += [results.notes[dataset], ""]
    for table in tables:
        parts += [f"### {table.spec.title.format(severity=severity)}", ""]
        if not table.spec.in_readme:
            parts += [f"Too long to show here: see `tables/{table.spec.name}.md` / `.csv` / `.tex`.", ""]
            continue
        mine = replace(table, columns=dataset_columns(table, results.headlines, dataset),
                       rows=[r for r in table.rows if r.dataset == dataset])
        parts.append(to_markdown(mine, drop_dataset=True))
        if table.spec.flags and any((dataset, r.method) in table.flagged for r in mine.rows):
            parts += [f"`{IMPROVING_MARK.strip()}`: still improving when training ended, or not learning, in at "
                      "least one seed of the method's own training log or its base's (see *Convergence*).", ""]
        if table.spec.source == "ood":
            parts += _best_scores(results, dataset, methods) + _ood_groups(results, dataset, methods)
    return parts


def _failed_and_damaged(results: AnalysisResults, methods: list[str]) -> list[str]:
    """The *Failed cells* and *Damaged cells* sections ("None." when there are none)."""
    parts = ["## Failed cells", ""]
    failures = _failures_in_order(results, methods)
    if len(failures):
        body = [[md_escape(str(v)) for v in row] for row in failures.itertuples(index=False)]
        parts.append(tabulate(body, headers=["dataset", "method", "seed", "reason"],
                              tablefmt="pipe", disable_numparse=True) + "\n")
    else:
        parts += ["None.", ""]

    parts += ["## Damaged cells", ""]
    damaged = results.damaged
    if len(damaged):
        body = [[md_escape(str(v)) for v in row] for row in damaged[["cell", "dataset", "method", "seed", "reason"]]
                .itertuples(index=False)]
        parts += ["Cells whose files no longer match their manifest (changed, missing or extra prediction "
                  "files, unusable arrays), and directories that name no cell. They are left out of every "
                  "table; `run` moves a damaged cell aside to `<cell>.damaged-<time>/` and recomputes it.", ""]
        parts.append(tabulate(body, headers=["cell", "dataset", "method", "seed", "reason"],
                              tablefmt="pipe", disable_numparse=True) + "\n")
    else:
        parts += ["None.", ""]
    return parts


def _plots_section(results: AnalysisResults, plots: list[tuple[str, str, Path]], out_dir: Path) -> list[str]:
    """The *Plots* section: each data set's plots (``(dataset, caption, path)``), linked
    relative to ``out_dir``."""
    parts = ["## Plots", ""]
    if not plots:
        parts += ["None.", ""]
    for dataset in results.datasets:
        mine = [(caption, path) for d, caption, path in plots if d == dataset]
        if not mine:
            continue
        parts += [f"### {dataset}", ""]
        for caption, path in mine:
            parts += [f"![{caption}]({path.relative_to(out_dir).as_posix()})", ""]
    return parts


def _best_scores(results: AnalysisResults, dataset: str, methods: list[str]) -> list[str]:
    """Which OOD score detects each OOD set best for each method: the highest seed-mean
    AUROC (ties: every tied score), with its value; nothing without OOD AUROC rows."""
    summary = results.summary
    if not len(summary):
        return []
    rows = summary[(summary["dataset"] == dataset) & (summary["table"] == "ood") & (summary["metric"] == "ood_auroc")]
    splits = [sp for sp in results.splits.get(dataset, []) if is_ood(sp) and sp in set(rows["split"])]
    body = []
    for method in methods:
        cells = []
        for split in splits:
            mine = rows[(rows["method"] == method) & (rows["split"] == split)].dropna(subset=["mean"])
            if not len(mine):
                cells.append("")
                continue
            best = mine["mean"].max()
            cells.append(", ".join(f"`{sc}`" for sc in sort_scores(mine.loc[mine["mean"] == best, "score"]))
                         + f" ({100 * best:.1f})")
        if any(cells):
            body.append([md_escape(method), *cells])
    if not body:
        return []
    return ["Best OOD score per method and OOD set (highest seed-mean AUROC, %):", "",
            tabulate(body, headers=["Method", *[f"`{sp}`" for sp in splits]], tablefmt="pipe",
                     disable_numparse=True) + "\n"]


GROUP_METRICS = ("ood_auroc", "ood_fpr95")  # the columns of the near/far OOD table


def _ood_groups(results: AnalysisResults, dataset: str, methods: list[str]) -> list[str]:
    """The data set's OOD groups (``ood_groups``: OpenOOD v1.5's near and far OOD): per
    method and score, the mean over the group's OOD sets of the seed-mean AUROC and FPR95;
    a cell is shown only where every set of the group has a value.  Nothing when the data
    set declares no groups or none of its OOD sets belongs to one."""
    groups = results.ood_groups.get(dataset)
    splits = [sp for sp in results.splits.get(dataset, []) if is_ood(sp)]
    order = sorted(groups or {}, key=lambda g: (g != "near", g != "far", g))  # near, far, then any other
    present = {g: [sp for sp in splits if sp.split("/", 1)[1] in groups[g]] for g in order}
    present = {g: sps for g, sps in present.items() if sps}
    summary = results.summary
    if not present or not len(summary):
        return []
    ood = summary[(summary["dataset"] == dataset) & (summary["table"] == "ood")]
    means = {(r.method, r.split, r.metric, r.score): r.mean for r in ood.itertuples(index=False)}
    shown = [m for m in GROUP_METRICS if m in set(ood["metric"])]
    columns = [(g, m) for m in shown for g in present]
    body = []
    for method in methods:
        for score in sort_scores(results.scores or set(ood["score"])):
            cells = []
            for g, m in columns:
                values = [means.get((method, sp, m, score)) for sp in present[g]]
                ok = all(v is not None and v == v for v in values)
                cells.append(f"{100 * sum(values) / len(values):.1f}" if ok else "")
            if any(cells):
                body.append([md_escape(method), f"`{score}`", *cells])
    if not body:
        return []
    labels = {"ood_auroc": "AUROC (%)", "ood_fpr95": "FPR95 (%)"}
    sets = "; ".join(f"{g}: {', '.join(f'`{sp}`' for sp in sps)}" for g, sps in present.items())
    return [f"OOD groups (OpenOOD v1.5's near and far OOD; the mean of the seed-means over each group's sets: "
            f"{sets}):", "",
            tabulate(body, headers=["Method", "Score", *[f"{g.capitalize()} {labels[m]}" for g, m in columns]],
                     tablefmt="pipe", disable_numparse=True, colalign=("left", "left", *["right"] * len(columns))) + "\n"]


def _fidelity(results: AnalysisResults, methods: list[str]) -> tuple[list[str], list[str]]:
    """The sentence naming the shown methods that run with differences from their authors'
    code (``results.deviations``), each with a footnote mark, and the footnotes: one per
    method, its differences joined by "; "."""
    shown = [m for m in methods if results.deviations.get(m)]
    if not shown:
        return [], []
    marks = ", ".join(f"`{m}`[^{i}]" for i, m in enumerate(shown, 1))
    sentence = (f"Methods run here with differences from their authors' code: {marks} (every difference, "
                "its official file and line and how to select the official behaviour: `docs/fidelity.md`).")
    notes = [f"[^{i}]: `{m}`: " + "; ".join(line.replace("\n", " ") for line in results.deviations[m]) + "."
             for i, m in enumerate(shown, 1)]
    return [sentence, ""], notes


STATES = ("missing", "running", "interrupted", "failed", "damaged")  # the order a summary counts them in


def left_out_summary(cells: Sequence[LeftOut], verb: str = "are not in this report") -> str:
    """``3 cell(s) are not in this report (1 missing, 2 running)`` (``verb``: what is said of them)."""
    counts = Counter(c.state for c in cells)
    parts = ", ".join(f"{counts[s]} {s}" for s in (*STATES, *sorted(set(counts) - set(STATES))) if counts[s])
    return f"{len(cells)} cell(s) {verb} ({parts})"


def _left_out(cells: Sequence[LeftOut], complete_with: str) -> list[str]:
    """The README's opening warning: the cells the tables leave out, with the command that
    completes them; nothing when the report is complete."""
    if not cells:
        return []
    parts = ["## Incomplete", "", f"**This report is incomplete (`--partial`): {left_out_summary(cells)}**; every "
                                  "table and plot below is without them."]
    if complete_with:
        parts[-1] += f" To complete them: `{complete_with}`, then report again."
    if any(c.state == "running" for c in cells):
        parts[-1] += " A running cell is being trained by the runner named: report again once it is done."
    body = [[f"`{c.key}`", md_escape(c.dataset), md_escape(c.method), str(c.seed), c.state, md_escape(c.detail)]
            for c in cells]
    parts += ["", tabulate(body, headers=["cell", "dataset", "method", "seed", "state", "detail"],
                           tablefmt="pipe", disable_numparse=True) + "\n"]
    return parts


def _failures_in_order(results: AnalysisResults, methods: list[str]) -> pd.DataFrame:
    """Failures of the shown methods, sorted by dataset/method display order, seed, reason."""
    f = results.failures
    cols = ["dataset", "method", "seed", "reason"]
    if not len(f):
        return pd.DataFrame(columns=cols)
    d_rank = {d: i for i, d in enumerate(results.datasets)}
    m_rank = {m: i for i, m in enumerate(methods)}
    f = f.loc[f["method"].isin(m_rank), cols].copy()
    f["_d"] = f["dataset"].map(lambda d: d_rank.get(d, len(d_rank)))
    f["_m"] = f["method"].map(m_rank)
    f = f.sort_values(["_d", "dataset", "_m", "seed", "reason"], kind="stable")
    return f[cols].reset_index(drop=True)

