"""The analysis of a catalog: :func:`analyse` and its result, :class:`AnalysisResults`.

:func:`analyse` evaluates every selected registered metric on every cell of a
:class:`~bench.store.catalog.Catalog` (:mod:`bench.analysis.evaluate`) and summarises the
values over seeds (:mod:`bench.analysis.summary`): paired bootstrap intervals and
significance against the reference method (``test`` and OOD splits), corruption
aggregates per severity, corruption errors and the efficiency of every method.
:class:`AnalysisResults` is what the analysis files hold and the report renders from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from bench.analysis.evaluate import (DAMAGED_COLUMNS, FAILURE_COLUMNS, UNSCORED_COLUMNS, analysed_metrics, analysed_scores,
                                     evaluate_catalog, split_order)
from bench.analysis.summary import (BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, SIGNIFICANCE, check_significance,
                                       corruption_errors, efficiency, severity_table, summarise)
from bench.analysis.training import (CONVERGENCE_COLUMNS, CONVERGENCE_SUMMARY_COLUMNS, TRAINING_COLUMNS,
                                     convergence)
from bench.store.catalog import Catalog


@dataclass
class AnalysisResults:
    """Everything the report renders (what :func:`bench.analysis.files.load` reads from the
    analysis files).

    ``metrics`` (per seed): columns :data:`~bench.analysis.evaluate.METRIC_COLUMNS`; values
    are raw (unscaled: accuracy in [0, 1], NLL in nats, ...).  Labelled-split metrics are
    rows for ``test`` and ``shift/...`` splits with ``score == ""``; OOD metrics are rows
    for ``ood/...`` splits, computed with the ``test`` split as the in-distribution side,
    once per OOD score of ``scores`` (registered in ``bench.core.registry.SCORES``; a score is
    computed where the store holds what it needs, and ``unscored`` names where it could
    not be).  ``seed`` is the training seed, or the replicate index for methods combined
    from several seeds (ensembles).

    ``summary`` (one row per dataset, method, split, metric, score): ``table``
    (``in_distribution`` for ``test``, ``shift``, ``ood``), ``n_seeds``, ``mean``, ``std``
    (over seeds, ddof=1; NaN for one seed), ``ci_low``/``ci_high`` (95% interval of the
    seed-mean), ``p_value`` and ``p_holm`` (test of the difference to ``reference``;
    Holm-corrected across the comparisons of one dataset's table, the ``"paper"``
    selection's metrics as one family and any further analysed metrics as another),
    ``verdict`` (``"ref"``; ``"better"``/``"worse"`` where p_holm < 0.05 in the metric's
    good direction; ``"better (one run)"``/``"worse (one run)"`` when one side's seed
    variation could not be measured; else ``""``), ``test`` (what the p-value accounts
    for, :data:`~bench.analysis.summary.TESTS`) and ``seeds_needed``
    (:func:`bench.analysis.bootstrap.seeds_needed` for the comparison's Holm family: the seeds per
    method a mark would need).  With the default ``significance``
    (``seeds_and_samples``) intervals and tests add the seed-level variance to the paired
    test-sample bootstrap (:mod:`bench.analysis.bootstrap`); with ``samples_seeds_fixed`` they are the
    percentile interval and z-test over test samples with the trained seeds held fixed.

    ``severity``: the metric averaged over the corruption types evaluated at a severity
    (1..5; 0 = the clean ``test`` split; -1 = every corruption split), then mean/std over
    seeds, with a bootstrap band for the metrics of the ``"severity"`` selection.
    ``corruption_errors``: per corruption the method's summed error over the reference's,
    and ``corruption == "mCE"`` their mean.  ``efficiency``: costs from ``cell.json``
    (means over seeds; combinators add up their members').  ``failures``: cells that
    failed or were interrupted, and derived replicates that could not be formed.
    ``damaged``: cells whose files no longer match their manifest, hold a stray prediction
    file or unusable arrays, and directories that name no cell (``cell`` = directory).
    ``training`` (every epoch of every trained cell's log), ``convergence`` (per cell and
    stage: the last epoch, the best-validation epoch and whether it was still improving)
    and ``convergence_summary`` (their means over seeds per method and stage, with the
    seeds still improving; post-hoc and derived methods show their base's logs): see
    :mod:`bench.analysis.training`.

    ``load_predictions(dataset, method, seed, split)`` returns ``(probs [N, C] float64,
    labels [N] int64)`` for plots (:meth:`bench.store.catalog.Catalog.predictions`).
    """

    suite: str
    metrics: pd.DataFrame
    datasets: list[str]  # display order
    methods: list[str]  # display order (suite order)
    splits: dict[str, list[str]]  # per dataset: evaluated splits in order (test, shift/..., ood/...)
    seeds: dict[tuple[str, str], list[int]]  # (dataset, method) -> seeds/replicates available
    failures: pd.DataFrame
    load_predictions: Callable[[str, str, int, str], tuple[np.ndarray, np.ndarray]]
    reference: str = ""  # the method significance and corruption errors are relative to
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    severity: pd.DataFrame = field(default_factory=pd.DataFrame)
    corruption_errors: pd.DataFrame = field(default_factory=pd.DataFrame)
    efficiency: pd.DataFrame = field(default_factory=pd.DataFrame)
    analysed_metrics: list[str] = field(default_factory=list)  # the metrics the files hold
    significance: str = SIGNIFICANCE  # the test behind the marks and intervals (stats.SIGNIFICANCE_TESTS)
    # dataset -> {metric shown in the tables: metric shown in its place} (e.g. CoLA's
    # accuracy column shows MCC, as the paper's Table 1): the data set's headline_metrics
    headlines: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # dataset -> its protocol note (report_note)
    # dataset -> OOD group (near, far) -> the OOD set names in it (the data set's ood_groups)
    ood_groups: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # method -> how it differs from its authors' code, one line each (Catalog.method_deviations)
    deviations: dict[str, list[str]] = field(default_factory=dict)
    damaged: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=DAMAGED_COLUMNS))
    scores: list[str] = field(default_factory=list)  # the OOD scores analysed, in display order
    # the selected OOD scores a method could not get on a dataset, and why (UNSCORED_COLUMNS)
    unscored: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=UNSCORED_COLUMNS))
    # the training logs and their convergence (bench.analysis.training)
    training: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=TRAINING_COLUMNS))
    convergence: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CONVERGENCE_COLUMNS))
    convergence_summary: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CONVERGENCE_SUMMARY_COLUMNS))


def analyse(catalog: Catalog, metrics: list[str] | None = None, resamples: int = BOOTSTRAP_RESAMPLES,
            seed: int = BOOTSTRAP_SEED, significance: str = SIGNIFICANCE,
            scores: list[str] | None = None) -> AnalysisResults:
    """Every table of the report, computed from the catalog's stored predictions.
    ``metrics``: the metrics to compute (default :func:`~bench.analysis.evaluate.analysed_metrics`);
    ``scores``: the OOD scores (default :func:`~bench.analysis.evaluate.analysed_scores`);
    ``significance``: the test behind marks and intervals (:data:`bench.analysis.bootstrap.SIGNIFICANCE_TESTS`).
    A metric that raises is named once among the failures (where it first raised, with its
    error); its summary rows where it raised have the verdict ``error`` and it gets no
    bootstrap, while every other metric is computed as usual."""
    check_significance(significance)
    evaluated = evaluate_catalog(catalog, list(metrics) if metrics is not None else analysed_metrics(), scores)
    cache, metrics_df, raised = evaluated.predictions, evaluated.metrics, evaluated.raised
    failed = {metric for _, _, _, _, metric, _ in raised}
    computed = [n for n in evaluated.names if n not in failed]  # bootstrapped: a metric that raised would raise again
    splits = {d: sorted({sp for (dn, _, _), p in cache.items() if dn == d for sp in p if sp != "val"},
                        key=split_order) for d in catalog.datasets}
    seeds: dict[tuple[str, str], list[int]] = {}
    for d, m, s in cache:
        seeds.setdefault((d, m), []).append(s)
    # methods whose units are training seeds (trained, or one member per replicate): two of
    # them with the same seeds are compared seed by seed
    by_seed = {e.name for e in catalog.methods if e.kind == "trained" or e.method.members_per_replicate() == 1}
    in_bootstrap: dict[str, tuple] = {}  # metric -> (dataset, method, seed, error) where its bootstrap first raised
    summary = summarise(metrics_df, cache, seeds, catalog.reference, computed, resamples, seed, evaluated.headlines,
                        by_seed, significance, in_bootstrap, evaluated.scores)
    severity = severity_table(metrics_df, cache, seeds, computed, seed, significance, in_bootstrap)
    if raised:
        at = {(d, m, split, metric, score) for d, m, _, split, metric, score in raised}
        keys = summary[["dataset", "method", "split", "metric", "score"]].itertuples(index=False, name=None)
        summary.loc[[k in at for k in keys], "verdict"] = "error"
    failures = evaluated.failures + [
        {"dataset": d, "method": m, "seed": s,
         "reason": f"metric {metric!r} raised {why} in its bootstrap; its values are shown, its intervals "
                   "and marks are left out"}
        for metric, (d, m, s, why) in in_bootstrap.items()]
    failures_df = pd.DataFrame(failures, columns=FAILURE_COLUMNS)
    if len(failures_df):
        failures_df = failures_df.sort_values(["dataset", "method", "seed", "reason"], kind="stable").reset_index(drop=True)
    trained = convergence(catalog)  # after evaluation: the cells found damaged there have left the catalog
    return AnalysisResults(
        suite=catalog.name,
        metrics=metrics_df,
        datasets=list(catalog.datasets),
        methods=[e.name for e in catalog.methods],
        splits=splits,
        seeds={k: sorted(v) for k, v in seeds.items()},
        failures=failures_df,
        damaged=pd.DataFrame(evaluated.damaged, columns=DAMAGED_COLUMNS),
        load_predictions=catalog.predictions,
        reference=catalog.reference,
        summary=summary,
        severity=severity,
        corruption_errors=corruption_errors(metrics_df, catalog.reference),
        efficiency=efficiency(catalog),
        analysed_metrics=evaluated.names,
        significance=significance,
        headlines=evaluated.headlines,
        notes=evaluated.notes,
        ood_groups=evaluated.ood_groups,
        deviations={e.name: lines for e in catalog.methods if (lines := catalog.method_deviations(e.name))},
        scores=analysed_scores(scores),
        unscored=evaluated.unscored,
        training=trained.training,
        convergence=trained.cells,
        convergence_summary=trained.summary,
    )
