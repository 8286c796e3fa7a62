"""bench/train/method.py: ``log_mean_exp``, the stable log of a mean of probabilities that
ensembles and Monte-Carlo predictions average with (the reference is scipy's
``logsumexp``); a derived method combines its members' predictions without changing them."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy.special import logsumexp as sp_logsumexp

from bench.train.method import log_mean_exp
from bench.store import Predictions


def test_log_mean_exp_is_stable_for_very_negative_inputs():
    x = np.array([[-1000.0, -1001.0, -2000.0], [-1000.0, -1003.0, -2000.5]])
    with np.errstate(divide="ignore", under="ignore"):
        naive = np.log(np.mean(np.exp(x), axis=0))
    assert np.isneginf(naive).all()  # the naive formula underflows
    got = log_mean_exp(x, axis=0)
    expected = [
        -1000.0,
        -1001.0 + math.log((1 + math.exp(-2.0)) / 2),
        -2000.0 + math.log((1 + math.exp(-0.5)) / 2),
    ]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got, sp_logsumexp(x, axis=0) - math.log(2), atol=1e-12)


def test_log_mean_exp_axis_and_infinities():
    rng = np.random.default_rng(4)
    x = rng.normal(scale=50.0, size=(3, 4, 5)) - 500.0
    for axis in (0, 1, 2):
        np.testing.assert_allclose(
            log_mean_exp(x, axis=axis), sp_logsumexp(x, axis=axis) - math.log(x.shape[axis]), atol=1e-9
        )
    y = np.array([[-np.inf, -np.inf], [-5.0, -np.inf]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = log_mean_exp(y, axis=0)
    assert got[0] == pytest.approx(-5.0 - math.log(2))
    assert np.isneginf(got[1])


def test_a_derived_method_cannot_edit_its_members_predictions():
    """A plugin's combine that writes into the stored log-probabilities it is handed raises;
    the members' arrays (the base method's stored predictions) are unchanged."""
    from bench.train.method import DerivedMethod, DerivedOptions

    class Sharpen(DerivedMethod):
        def combine(self, members, labels):
            (preds,) = members
            for lp in preds.values():
                lp *= 2.0
            return dict(preds)

    lp = np.log(np.full((4, 2), 0.5, dtype=np.float32))
    member = {"test": Predictions(lp, np.zeros(4, dtype=np.int64))}
    before = lp.copy()
    with pytest.raises(ValueError, match="read-only"):
        Sharpen(DerivedOptions()).predict_from([member])
    np.testing.assert_array_equal(member["test"].log_probs, before)
