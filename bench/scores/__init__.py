"""Post-hoc OOD scores: what the OOD metrics rank in-distribution and OOD images by.

Every score is registered in ``bench.core.registry.SCORES`` by the :func:`ood_score`
decorator with its metadata (:class:`Score`: label, convention, what it reads and needs,
reference, place in the default selection); higher = more in-distribution throughout
(OpenOOD v1.5's sign).  Analysis computes them from the store only (never the model):

==============  =================================================================
``record``      :class:`Score`, :func:`ood_score`, :class:`TrainingFeatures`,
                :data:`ARRAYS` (the stored arrays a score ``reads``),
                the default selection and the checks of ``--scores``
``outputs``     MSP, entropy, mutual information, max logit, energy, predictive
                variance (probabilities, logits, the spread of the passes)
``features``    Mahalanobis, relative Mahalanobis, KNN, ViM, residual, DDU's feature
                density (fitted on the stored training features)
==============  =================================================================

``python run_suite.py list`` lists them; a plugin registers a score with the same
decorator.
"""
from __future__ import annotations

from bench.scores.features import (GDA_JITTERS, fit_gaussians, fit_gda, fit_knn, fit_vim, gda_jitter, gda_log_density,
                                   knn_k, knn_score, mahalanobis_score, normalise, relative_mahalanobis_score, residual_norm, vim_dim, vim_score)
from bench.scores.outputs import energy_score, max_logit_score, msp_score
from bench.scores.record import (ARRAYS, NEEDS, TRAINING, Score, TrainingFeatures, default_scores, detector_cost, get_score,
                                 ood_score,
                                 score_key, score_order, sort_scores, validate_scores)

__all__ = ["ARRAYS", "NEEDS", "TRAINING", "Score", "TrainingFeatures", "default_scores", "detector_cost", "get_score", "ood_score",
           "score_key", "score_order", "sort_scores", "validate_scores", "msp_score", "max_logit_score", "energy_score", "fit_gaussians",
           "mahalanobis_score", "relative_mahalanobis_score", "normalise", "fit_knn", "knn_k", "knn_score",
           "fit_vim", "vim_dim", "vim_score", "residual_norm", "GDA_JITTERS", "fit_gda", "gda_jitter",
           "gda_log_density"]
