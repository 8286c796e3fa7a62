"""methods/deep_ensemble.py: ensembles formed from the stored predictions of member cells.

References are written here with scipy (``scipy.special.log_softmax``/``logsumexp``) and
closed forms; no expected value comes from the code under test.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.special import log_softmax as sp_log_softmax
from scipy.special import logsumexp as sp_logsumexp

from bench.core.registry import METHODS
from methods.deep_ensemble import Ensemble, EnsembleOptions


def members_case(m: int = 4, n: int = 50, c: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    splits = ("val", "test", "shift/blur/2", "ood/x")
    logits = {s: rng.normal(scale=3.0, size=(m, n, c)) for s in splits}
    members = [{s: sp_log_softmax(logits[s][k], axis=-1).astype(np.float32) for s in splits} for k in range(m)]
    labels = {s: (np.full(n, -1) if s.startswith("ood/") else rng.integers(0, c, n)) for s in splits}
    return logits, members, labels


def test_ensemble_probs_is_log_of_mean_probability():
    logits, members, labels = members_case()
    method = Ensemble(EnsembleOptions(members=4, average="probs"))
    out = method.combine(members, labels)
    assert set(out) == set(logits)
    for s in logits:
        stack = np.stack([mem[s].astype(np.float64) for mem in members])
        expected = sp_logsumexp(stack, axis=0) - math.log(len(members))
        np.testing.assert_allclose(out[s], expected, atol=1e-10)
        # same thing directly in probability space
        np.testing.assert_allclose(np.exp(out[s]), np.exp(stack).mean(axis=0), atol=1e-10)
        np.testing.assert_allclose(sp_logsumexp(out[s], axis=1), 0.0, atol=1e-6)


def test_ensemble_logits_is_softmax_of_mean_logit():
    logits, members, labels = members_case(m=3, seed=1)
    method = Ensemble(EnsembleOptions(members=3, average="logits"))
    out = method.combine(members, labels)
    for s in logits:
        stack = np.stack([mem[s].astype(np.float64) for mem in members])
        np.testing.assert_allclose(out[s], sp_log_softmax(stack.mean(axis=0), axis=-1), atol=1e-10)
        # log-probs differ from logits by a per-row constant: softmax of the mean *logit*
        np.testing.assert_allclose(out[s], sp_log_softmax(logits[s].mean(axis=0), axis=-1), atol=1e-5)


def test_ensemble_rules_differ_when_members_disagree():
    a = np.log(np.array([[0.9, 0.1]]))
    b = np.log(np.array([[0.2, 0.8]]))
    members = [{"test": a}, {"test": b}]
    probs = Ensemble(EnsembleOptions(members=2, average="probs")).combine(members, {"test": np.array([0])})
    logit = Ensemble(EnsembleOptions(members=2, average="logits")).combine(members, {"test": np.array([0])})
    np.testing.assert_allclose(np.exp(probs["test"]), [[0.55, 0.45]], atol=1e-12)
    g = np.sqrt([0.9 * 0.2, 0.1 * 0.8])  # geometric mean, renormalised
    np.testing.assert_allclose(np.exp(logit["test"]), [g / g.sum()], atol=1e-12)


def test_single_member_ensemble_is_identity():
    _, members, labels = members_case(m=1, seed=2)
    for avg in ("probs", "logits"):
        out = Ensemble(EnsembleOptions(members=1, average=avg)).combine(members, labels)
        for s, lp in members[0].items():
            np.testing.assert_allclose(out[s], lp.astype(np.float64), atol=1e-6)


def test_ensemble_replicates_are_disjoint_consecutive_blocks():
    method = METHODS.get("deep_ensemble")(EnsembleOptions(members=3))
    reps = method.replicates((0, 1, 2, 3, 4, 5))
    assert reps == [(0, (0, 1, 2)), (1, (3, 4, 5))]
    blocks = [set(b) for _, b in reps]
    assert not blocks[0] & blocks[1]
    # leftover seeds that do not fill a block are not used; ids count blocks, not seeds
    assert method.replicates((10, 11, 12, 13, 14, 15, 16)) == [(0, (10, 11, 12)), (1, (13, 14, 15))]
    assert method.replicates((1, 2)) == []
    assert METHODS.get("ensemble") is METHODS.get("deep_ensemble")
