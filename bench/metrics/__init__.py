"""Uncertainty metrics as pure numpy functions (definitions: ``docs/reference/metrics.md``).

Every function returns a raw, unscaled Python ``float`` (accuracy and ECE as fractions in
[0, 1], NLL in nats, Brier in [0, 2], AURC/E-AURC as plain risks); scales such as %, x100
or x1000 are applied only in reports.  The default conventions are the paper-faithful ones
(KEP-SVGP, official code ``CIFAR/utils/metrics.py``); every other convention of
``metrics.md`` is registered beside its default under its own name (``ece_torchmetrics``,
``ece_adaptive``, ``aurc_unique``, ``augrc``, ``ood_fpr95_openood``, ...), with the same
signature and raw scale, and its docstring states it exactly.

Each module states the conventions it implements:

==================  =====================================================================
``inputs``          what the metrics accept (shapes, dtypes, ranges) and the checks
``record``          :class:`Metric`, the :func:`metric` decorator, named selections
``classification``  accuracy, MCC, NLL, Brier
``calibration``     the reliability bins (:func:`calibration_bins`), ECE and its variants
``selective``       the risk-coverage curve: AURC, E-AURC, AUGRC, operating points
``failure``         misclassification detection: AUROC, FPR95, AUPR-Success/-Error
``ood``             ID-vs-OOD detection: AUROC, AUPR-In/-Out, FPR95
``curves``          the binary ROC / PR curve of a scoring problem at every threshold
``resample``        what the vectorised bootstrap kernels share
``decomposition``   entropy and the total/aleatoric/epistemic decomposition
==================  =====================================================================

Importing this package registers every built-in metric.  It exports the record
(:class:`Metric`, :func:`metric`, :func:`get_metric`, :func:`selection`, ...), the input
checks, :func:`calibration_bins`, :func:`risk_coverage_curve`, :func:`entropy`,
:func:`decompose`, :func:`mutual_information` and every metric function by its name (``bench.metrics.ece``);
``python run_suite.py list`` lists the metrics.
"""
from __future__ import annotations

from bench.metrics.calibration import (
    BINNINGS,
    CALIBRATION_TARGETS,
    calibration_bins,
    ece,
    ece_adaptive,
    ece_all_class,
    ece_classwise,
    ece_debiased,
    ece_fdshifts,
    ece_torchmetrics,
    mce,
    mce_all_class,
    rms_ce,
    rms_ce_adaptive100,
    torch_linspace_float32,
)
from bench.metrics.classification import (
    MCC_BATCH,
    accuracy,
    brier,
    brier_top_label,
    mcc,
    mcc_per_batch,
    nll,
)
from bench.metrics.decomposition import decompose, entropy, mutual_information
from bench.metrics.failure import (
    failure_aupr_error,
    failure_aupr_error_trapezoid,
    failure_aupr_success,
    failure_aupr_success_ap,
    failure_auroc,
    failure_fpr95,
    failure_fpr95_first,
)
from bench.metrics.inputs import check_probs_labels, check_scores
from bench.metrics.ood import (
    ood_aupr_in,
    ood_aupr_in_trapezoid,
    ood_aupr_out,
    ood_aupr_out_trapezoid,
    ood_auroc,
    ood_fpr95,
    ood_fpr95_openood,
    ood_fpr95_tu,
)
from bench.metrics.record import (
    APPROXIMATE_CALIBRATION,
    KINDS,
    UNITS,
    Metric,
    get_metric,
    metric,
    registered,
    selection,
)
from bench.metrics.selective import (
    augrc,
    augrc_trapezoid,
    aurc,
    aurc_trapezoid,
    aurc_unique,
    coverage_at_5_risk,
    eaurc,
    eaurc_discrete,
    eaurc_fdshifts,
    risk_at_80_coverage,
    risk_coverage_curve,
)

__all__ = [
    "KINDS",
    "UNITS",
    "APPROXIMATE_CALIBRATION",
    "Metric",
    "metric",
    "get_metric",
    "selection",
    "registered",
    "check_probs_labels",
    "check_scores",
    "BINNINGS",
    "CALIBRATION_TARGETS",
    "MCC_BATCH",
    "calibration_bins",
    "torch_linspace_float32",
    "risk_coverage_curve",
    "entropy",
    "decompose",
    "mutual_information",
]
__all__ += [  # every built-in metric function, by its registered name (see ``run_suite.py list``)
    "accuracy", "brier", "brier_top_label", "mcc", "mcc_per_batch", "nll",
    "ece", "ece_adaptive", "ece_all_class", "ece_classwise", "ece_debiased", "ece_fdshifts", "ece_torchmetrics",
    "mce", "mce_all_class", "rms_ce", "rms_ce_adaptive100",
    "aurc", "aurc_trapezoid", "aurc_unique", "eaurc", "eaurc_discrete", "eaurc_fdshifts", "augrc",
    "augrc_trapezoid", "risk_at_80_coverage", "coverage_at_5_risk",
    "failure_auroc", "failure_fpr95", "failure_fpr95_first", "failure_aupr_success", "failure_aupr_success_ap",
    "failure_aupr_error", "failure_aupr_error_trapezoid",
    "ood_auroc", "ood_fpr95", "ood_fpr95_openood", "ood_fpr95_tu", "ood_aupr_in", "ood_aupr_in_trapezoid",
    "ood_aupr_out", "ood_aupr_out_trapezoid",
]
