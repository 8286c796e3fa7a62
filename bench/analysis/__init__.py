"""Analysis: a store's predictions -> versioned result files that the report reads.

Four steps, one module each, below :func:`analyse` (:mod:`bench.analysis.results`):

* :mod:`bench.analysis.evaluate` -- every selected registered metric on every cell of a
  :class:`~bench.store.catalog.Catalog` (derived methods combined from their members' stored
  predictions): labelled-split metrics (kinds other than ``ood``) on ``test`` and
  ``shift/...`` splits, OOD metrics on ``ood/...`` splits with the ``test`` split as the
  in-distribution side, once per registered OOD score (:mod:`bench.scores`) the store
  holds what it needs for (features fitted on the cell's stored training features);
* :mod:`bench.analysis.summary` -- mean and std over seeds, paired bootstrap intervals
  and significance against the reference method (``test`` and OOD splits), corruption
  aggregates per severity, corruption errors and the efficiency of every method;
* :mod:`bench.analysis.training` -- every trained cell's training log, judged by one rule
  (:data:`RULE`): still improving at the end of training, not learning, or neither, per cell
  and per method;
* :mod:`bench.analysis.files` -- the analysis files (:func:`save`, :func:`load`) and the
  cache (:func:`analyse_store`: the files are reused while their fingerprint, over the
  store, the selection, the options and the analysis code, is unchanged).

Everything is seeded: the same store gives the same numbers.
"""
from bench.analysis.evaluate import (DAMAGED_COLUMNS, FAILURE_COLUMNS, METRIC_COLUMNS, UNSCORED_COLUMNS,
                                     analysed_metrics, analysed_scores, evaluate, evaluate_catalog, ood_scores,
                                     split_order, table_of)
from bench.analysis.files import ANALYSIS_DIR, ANALYSIS_SCHEMA, FILES, analyse_store, fingerprint, load, read_manifest, save
from bench.analysis.results import AnalysisResults, analyse
from bench.analysis.summary import (ALPHA, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CE_COLUMNS, EFFICIENCY_COLUMNS,
                                       EFFICIENCY_FIELDS, SEVERITY_COLUMNS, SEVERITY_RESAMPLES, SIGNIFICANCE,
                                       SUMMARY_COLUMNS, TESTS, check_significance)
from bench.analysis.training import (CONVERGENCE_COLUMNS, CONVERGENCE_FIELDS, CONVERGENCE_SUMMARY_COLUMNS, IMPROVING,
                                     NOT_LEARNING, RULE, TRAINING_COLUMNS, UNJUDGED, judge)

__all__ = ["AnalysisResults", "analyse", "analyse_store", "analysed_metrics", "save", "load", "fingerprint",
           "read_manifest", "evaluate", "evaluate_catalog", "ood_scores", "check_significance", "split_order",
           "table_of", "analysed_scores", "ANALYSIS_DIR", "ANALYSIS_SCHEMA", "FILES", "UNSCORED_COLUMNS", "TESTS", "SIGNIFICANCE", "ALPHA",
           "BOOTSTRAP_RESAMPLES", "BOOTSTRAP_SEED", "SEVERITY_RESAMPLES", "METRIC_COLUMNS", "SUMMARY_COLUMNS",
           "SEVERITY_COLUMNS", "CE_COLUMNS", "EFFICIENCY_COLUMNS", "EFFICIENCY_FIELDS", "FAILURE_COLUMNS",
           "DAMAGED_COLUMNS", "TRAINING_COLUMNS", "CONVERGENCE_COLUMNS", "CONVERGENCE_SUMMARY_COLUMNS",
           "CONVERGENCE_FIELDS", "RULE", "IMPROVING", "NOT_LEARNING", "UNJUDGED", "judge"]
