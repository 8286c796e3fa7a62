"""Coverage of the report's intervals, false-positive rate and power of its marks, by simulation.

Predictions are simulated with a known ground truth in the design of a real benchmark: N
test images shared by every seed (crossed), S seeds per method, and seed-level variation.

* Image i: a difficulty z_i ~ N(0, 1) and a label y_i, the same for every seed and method.
* Seed s: a skill a_s ~ N(skill, seed_sd^2).  Its margin on image i is
  m = a_s + image_sd z_i + own_sd e_si with its own noise e_si ~ N(0, 1).  ``image_sd``
  large against ``own_sd`` makes the seeds miss the same images (per-image error
  correlation about 0.3 between seeds, as in real benchmarks, where image_sd = own_sd = 1
  gives about 0.05); the study prints the correlation it measured.
* The prediction: confidence c(m) = 1/K + (1 - 1/K) sigmoid(m) on the predicted class,
  (1 - c)/(K - 1) on each other class; it is correct with probability
  f(m) = 1/K + (1 - 1/K) sigmoid(temperature * m) (temperature 1: calibrated; below 1:
  overconfident by a known calibration map), else a uniformly drawn wrong class.

The truth a seed-mean estimates is the expectation over seeds of each metric's population
value (infinite test set): accuracy E f, NLL E[f (-log c) + (1 - f)(-log((1 - c)/(K - 1)))],
the 15-bin top-label ECE sum_b |E[(f - c) 1{c in bin b}]| (bins (lo, hi] on k/15),
and AURC = integral over coverage of the selective risk when the most confident are kept
(by quadrature on m, Gauss-Hermite over the seed skill).  The debiased ECE estimates the
same ECE.

For every replicate, each metric and interval kind, the study records whether the 95%
interval of the seed-mean covers the truth: ``seeds+samples`` (the report's default,
``bench.analysis.bootstrap.seed_mean``, centred as the report centres the metric), ``samples, seeds
fixed`` (the percentile bootstrap over test samples, the ``samples_seeds_fixed`` option)
and ``seeds only`` (Student's t over the S per-seed values, ignoring test-sample noise),
and the centre of the default interval.  Under the null of two identical methods (same
settings, their own seeds, the same test images), it records how often the test behind a
mark gives p < 0.05: the default ``bench.analysis.bootstrap.difference`` (paired over seed ids, as the
report pairs two trained methods), the seeds-fixed z-test, and ``WS df`` (the default's
estimate on Welch-Satterthwaite degrees of freedom that count the test images' part of
the variance as known: a candidate with more power), per metric and for the family (any
mark after Holm over the metrics).  For a metric whose estimate is bias-corrected by
construction (the debiased ECE) it also records the centre, coverage and false marks
had the bootstrap's bias correction been applied to it as well.

The power study (:func:`power`) compares a method with a reference whose true accuracy is
1, 2 or 5 points lower, accuracy alone, with up to :data:`POWER_SEEDS` seeds each: how
often the default test marks the difference in a Holm family of m comparisons (p below
0.05 / m: what Holm asks of the one comparison that differs, the others null), and what
``bench.analysis.bootstrap.seeds_needed`` prints for that family from 3, 5 and 10 seeds, against the
seed count at which the simulated power reaches 80%.  The family sizes m are the test alone,
one method's paper metrics and each reference suite's table (:func:`suite_families`, as
``bench.analysis.summary.summarise`` forms its Holm families).

:func:`l1_tradeoff` checks what a smaller bias of an l1 calibration error at true ECE 0 costs
away from 0: the debiased ECE against plug-in ECE with each bin's gap soft-thresholded
(:func:`soft_thresholded_ece`), on a calibrated and an overconfident setting.

    nice -n 19 .venv/bin/python benchmarks/coverage.py [--replicates 300] [--power-replicates 300]

writes ``reports/perf/coverage.md``.  ``tests/benchmarks/test_coverage.py`` runs a small version.
"""
from __future__ import annotations

import argparse
import functools
import os
import shlex
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core per process, before numpy loads its BLAS

import numpy as np  # noqa: E402
from scipy import stats as sp  # noqa: E402
from scipy.special import expit, log_expit  # noqa: E402

from bench.analysis import bootstrap  # noqa: E402
from bench.config.spec import load_suite  # noqa: E402
from bench.metrics import calibration_bins, get_metric, selection  # noqa: E402
from bench.report.tables import NOT_REACHED  # noqa: E402

METRICS = ("accuracy", "nll", "aurc", "ece", "ece_debiased")
KINDS = ("seeds+samples", "samples, seeds fixed", "seeds only")
#: The tests behind a mark the study runs under the null: the report's default, its
#: seeds-fixed option, and the default estimate on Welch-Satterthwaite df (module docstring).
TESTS = ("seeds+samples", "samples, seeds fixed", "WS df")
LEVEL = 0.95
ALPHA = 0.05
ECE_BINS = 15


@dataclass(frozen=True)
class Setting:
    """One simulated benchmark (module docstring)."""

    name: str
    n: int = 1000  # test images
    seeds: int = 3  # seeds per method
    skill: float = 2.8  # mean margin: sets the accuracy
    seed_sd: float = 0.25  # sd of a seed's skill: the seed-level variation
    temperature: float = 0.7  # < 1: overconfident
    classes: int = 10
    image_sd: float = 1.0  # weight of the image difficulty shared by every seed
    own_sd: float = 1.0  # weight of each seed's own noise on each image

    def confidence(self, m: np.ndarray) -> np.ndarray:
        return 1.0 / self.classes + (1.0 - 1.0 / self.classes) * expit(m)

    def correct_probability(self, m: np.ndarray) -> np.ndarray:
        return 1.0 / self.classes + (1.0 - 1.0 / self.classes) * expit(self.temperature * m)


SAME_IMAGES = {"image_sd": 3.0, "own_sd": 0.5}  # seeds miss the same images (error correlation ~0.3)
SETTINGS = (
    Setting("acc 0.86, N 1000, 3 seeds, overconfident"),
    Setting("acc 0.86, N 1000, 5 seeds, overconfident", seeds=5),
    Setting("acc 0.48, N 1000, 3 seeds, overconfident", skill=-0.5),
    Setting("acc 0.86, N 1000, 3 seeds, calibrated", skill=2.26, temperature=1.0),
    Setting("acc 0.86, N 3000, 3 seeds, overconfident", n=3000),
    Setting("acc 0.86, N 1000, 3 seeds, no seed variation", seed_sd=0.0),
    Setting("acc 0.86, N 1000, one run, overconfident", seeds=1),
    Setting("acc 0.86, N 1000, 3 seeds, overconfident, same images", skill=4.0, **SAME_IMAGES),
    Setting("acc 0.86, N 1000, 5 seeds, overconfident, same images", skill=4.0, seeds=5, **SAME_IMAGES),
    Setting("acc 0.86, N 1000, 3 seeds, calibrated, same images", skill=2.95, temperature=1.0, image_sd=2.3,
            own_sd=0.5),
    Setting("acc 0.53, N 1000, 3 seeds, overconfident, same images", skill=-0.3, **SAME_IMAGES),
)
#: The power study's benchmark: seeds that miss the same images, N 1,000.
POWER_SETTING = SETTINGS[7]
#: The l1 trade-off's settings: true ECE 0, and the same accuracy overconfident (true ECE 4.9 points).
TRADEOFF_SETTINGS = (SETTINGS[3], SETTINGS[0])
POWER_DELTAS = (0.01, 0.02, 0.05)  # true accuracy gains of the method over the reference
POWER_GRID = (2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80)  # seeds per method
POWER_SEEDS = POWER_GRID[-1]
#: The suites whose reports are committed (reports/<suite>/).
REFERENCE_SUITES = ("default", "cifar10_subset", "text", "variants", "zoo")


@functools.cache
def paper_metrics() -> int:
    """The paper selection's metrics of a labelled split: one method's comparisons in the
    test split's Holm family (``bench.analysis.summary.summarise``)."""
    return sum(not get_metric(name).on_scores for name in selection("paper"))


@functools.cache
def suite_families(suites=REFERENCE_SUITES) -> dict[str, int]:
    """Each suite's Holm family on its test split as ``bench.analysis.summary.summarise``
    forms it: the paper metrics of a labelled split times the methods compared with the
    reference (every method of the suite but the reference)."""
    return {name: paper_metrics() * (len(load_suite(name).methods) - 1) for name in suites}


#: Holm family sizes: the test alone, one method's paper metrics, and each reference
#: suite's table (:func:`suite_families`).
FAMILIES = tuple(sorted({1, paper_metrics(), *suite_families().values()}))
PRINTED_AT = (3, 5, 10)  # seed counts from which the study reads what seeds_needed prints


# ---------------------------------------------------------------------------- the truth

def _population(setting: Setting, skill: float, points: int = 20001) -> dict[str, float]:
    """Population metrics of one seed with this skill (quadrature over its margin m ~
    N(skill, image_sd^2 + own_sd^2): image difficulty and its own noise)."""
    x = np.linspace(-9.0, 9.0, points)
    m = skill + np.hypot(setting.image_sd, setting.own_sd) * x
    w = sp.norm.pdf(x) * (x[1] - x[0])
    w /= w.sum()
    c, f, k = setting.confidence(m), setting.correct_probability(m), setting.classes
    out = {
        "accuracy": float(np.sum(w * f)),
        # -log((1 - c)/(K - 1)) = log K - log sigmoid(-m), finite where c rounds to 1
        "nll": float(np.sum(w * (f * -np.log(c) + (1 - f) * (np.log(k) - log_expit(-m))))),
    }
    bins = np.clip(np.ceil(c * ECE_BINS).astype(int) - 1, 0, ECE_BINS - 1)  # (lo, hi] on k/15
    out["ece"] = float(np.abs(np.bincount(bins, weights=w * (f - c), minlength=ECE_BINS)).sum())
    # AURC: keep the most confident (largest m) first; risk at coverage q = errors / q
    order = np.argsort(-m)
    coverage = np.cumsum(w[order])
    risk = np.cumsum(w[order] * (1 - f[order])) / coverage
    out["aurc"] = float(np.sum(w[order] * risk))
    out["ece_debiased"] = out["ece"]
    return out


def truth(setting: Setting, nodes: int = 40) -> dict[str, float]:
    """Expectation over the seed skill of each population metric (Gauss-Hermite)."""
    if setting.seed_sd == 0.0:
        return _population(setting, setting.skill)
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    values = [_population(setting, setting.skill + setting.seed_sd * xi) for xi in x]
    return {name: float(sum(wi * v[name] for wi, v in zip(w, values))) for name in METRICS}


def with_accuracy_gain(setting: Setting, gain: float) -> Setting:
    """``setting`` with the skill whose true accuracy is ``gain`` (a fraction) above its own."""
    from scipy.optimize import brentq

    goal = truth(setting)["accuracy"] + gain
    skill = brentq(lambda a: truth(replace(setting, skill=a))["accuracy"] - goal, setting.skill, setting.skill + 10.0,
                   xtol=1e-6)
    return replace(setting, name=f"{setting.name}, +{100 * gain:g} points", skill=skill)


# ----------------------------------------------------------------------- the simulation

def _predictions(setting: Setting, rng: np.random.Generator, z: np.ndarray, labels: np.ndarray):
    """One seed's probabilities [N, K] on the shared images."""
    n, k = z.shape[0], setting.classes
    m = rng.normal(setting.skill, setting.seed_sd) + setting.image_sd * z + setting.own_sd * rng.normal(size=n)
    c = setting.confidence(m)
    correct = rng.random(n) < setting.correct_probability(m)
    predicted = np.where(correct, labels, (labels + rng.integers(1, k, n)) % k)
    probs = np.repeat(((1 - c) / (k - 1))[:, None], k, axis=1)
    probs[np.arange(n), predicted] = c
    return probs


def error_correlation(errors: list[np.ndarray]) -> float:
    """Mean Pearson correlation, over pairs of seeds, of their per-image error indicators
    (NaN below two seeds)."""
    pairs = [np.corrcoef(errors[i], errors[j])[0, 1] for i in range(len(errors)) for j in range(i)]
    return float(np.mean(pairs)) if pairs else float("nan")


def ws_p_value(est: bootstrap.TwoLevel, units_a: bootstrap.Units, units_b: bootstrap.Units) -> float:
    """Two-sided p-value of ``est`` (a paired :func:`bench.analysis.bootstrap.difference`) on
    Welch-Satterthwaite df that count the test images' part of its variance as known:
    df = se^4 / (v^2 / (S - 1)), v = the variance of the mean of the S per-seed differences
    (>= S - 1, the default's df).  ``est.p_value()`` where no seed spread was measured."""
    d = np.array([units_a[k] - units_b[k] for k in sorted(units_a)])
    v = float(d.var(ddof=1)) / d.size if d.size >= 2 else float("nan")
    if not (np.isfinite(v) and v > 0 and np.isfinite(est.se) and est.se > 0):
        return est.p_value()
    df = est.se ** 4 / (v ** 2 / (d.size - 1))
    return replace(est, df=df).p_value()


def _seed_run(setting: Setting, rng, z, labels, w, metrics, errors: list | None = None):
    """One seed's metric values and bootstrap rows: ``({metric: value}, {metric: [B]})``;
    appends its per-image errors to ``errors`` when given."""
    probs = _predictions(setting, rng, z, labels)
    if errors is not None:
        errors.append(probs.argmax(axis=1) != labels)
    return ({name: get_metric(name)(probs, labels) for name in metrics},
            {name: bootstrap.boot_metric(name, probs, labels, w) for name in metrics})


def simulate(setting: Setting, replicates: int, resamples: int, metrics=METRICS, seed: int = 0) -> dict:
    """Coverage, interval centres and null rejection counts over ``replicates`` simulated
    benchmarks.

    Returns ``{"truth": {metric: value}, "covered": {(metric, kind): count},
    "width": {(metric, kind): summed width}, "estimate": {metric: summed seed-mean},
    "center": {metric: summed centre of the default interval},
    "rejected": {(metric, test): count}, "family": {test: count},
    "again": {(metric, "center" | "covered" | "rejected"): sum}, "correlation": summed
    per-image error correlation, "replicates": R}``; ``again`` holds the metrics whose
    estimate is bias-corrected by construction, as they would be with the bootstrap's bias
    correction applied as well."""
    rng = np.random.default_rng(seed)
    target = truth(setting)
    covered = {(m, k): 0 for m in metrics for k in KINDS}
    width = {(m, k): 0.0 for m in metrics for k in KINDS}
    estimate, center = dict.fromkeys(metrics, 0.0), dict.fromkeys(metrics, 0.0)
    rejected = {(m, t): 0 for m in metrics for t in TESTS}
    family = dict.fromkeys(TESTS, 0)
    again = {(m, q): 0.0 for m in metrics if get_metric(m).bias_corrected for q in ("center", "covered", "rejected")}
    correlation = 0.0
    for _ in range(replicates):
        z = rng.normal(size=setting.n)
        labels = rng.integers(0, setting.classes, setting.n)
        w = bootstrap.resample_weights(setting.n, resamples, seed=int(rng.integers(1 << 31)))
        units, boots, errors = {}, {}, []
        for method in ("a", "b"):  # two identical methods, each with its own seeds
            for s in range(setting.seeds):
                values, rows = _seed_run(setting, rng, z, labels, w, metrics, errors if method == "a" else None)
                for name in metrics:
                    units.setdefault((method, name), {})[s] = values[name]
                    boots.setdefault((method, name), {})[s] = rows[name]
        correlation += error_correlation(errors) if setting.seeds > 1 else 0.0
        p_values = {t: [] for t in TESTS}
        for name in metrics:
            corrected = get_metric(name).bias_corrected
            u, b = units[("a", name)], boots[("a", name)]
            values = np.array(list(u.values()))
            estimate[name] += float(values.mean())
            dist = bootstrap.seed_mean_distribution(list(b.values()))
            mean = bootstrap.seed_mean(u, b, bias_corrected=corrected)
            center[name] += mean.center
            intervals = {
                "seeds+samples": mean.interval(LEVEL),
                "samples, seeds fixed": bootstrap.bootstrap_ci(dist, LEVEL),
                "seeds only": (sp.t.interval(LEVEL, len(values) - 1, loc=values.mean(), scale=sp.sem(values))
                               if len(values) > 1 else (np.nan, np.nan)),
            }
            for kind, (lo, hi) in intervals.items():
                covered[(name, kind)] += int(lo <= target[name] <= hi)
                width[(name, kind)] += float(hi - lo)
            ub, bb = units[("b", name)], boots[("b", name)]
            est = bootstrap.difference(u, b, ub, bb, paired=True)
            dist_b = bootstrap.seed_mean_distribution(list(bb.values()))
            p_fixed = bootstrap.paired_z_test(dist - dist_b, float(values.mean() - np.mean(list(ub.values()))))
            for test, p in (("seeds+samples", est.p_value()), ("samples, seeds fixed", p_fixed),
                            ("WS df", ws_p_value(est, u, ub))):
                rejected[(name, test)] += int(p < ALPHA)
                p_values[test].append(p)
            if corrected:  # as it would be with the bootstrap's bias correction as well
                twice = bootstrap.seed_mean(u, b)
                lo, hi = twice.interval(LEVEL)
                again[(name, "center")] += twice.center
                again[(name, "covered")] += int(lo <= target[name] <= hi)
                again[(name, "rejected")] += int(
                    bootstrap.difference(u, b, ub, bb, paired=True, bias_corrected=False).p_value() < ALPHA)
        for test in TESTS:
            family[test] += int(np.nanmin(bootstrap.holm(p_values[test])) < ALPHA)
    return {"truth": target, "covered": covered, "width": width, "estimate": estimate, "center": center,
            "rejected": rejected, "family": family, "again": again, "correlation": correlation,
            "replicates": replicates}


def power(setting: Setting, replicates: int, resamples: int, deltas=POWER_DELTAS, grid=POWER_GRID,
          families=FAMILIES, printed_at=PRINTED_AT, seed: int = 0) -> dict:
    """Power of the default test for true accuracy gains ``deltas`` over a reference with
    ``setting``'s accuracy, accuracy alone, the first S of ``max(grid)`` seeds per method
    for each S in ``grid`` (the reference's seeds shared by every gain).

    A mark in a Holm family of m comparisons (m in ``families``) is p < 0.05 / m with the
    method ahead: Holm's first step, which the one comparison that differs must pass.
    Returns ``{"marked": {(delta, S, m): count}, "marked_ws": the same for
    :func:`ws_p_value`, "needed": {(delta, S, m): [what seeds_needed printed]} for S in
    ``printed_at``, "seed_sd": mean per-seed accuracy sd of the reference (at max(grid)
    seeds), "replicates": R}``."""
    rng = np.random.default_rng(seed)
    better = {d: with_accuracy_gain(setting, d) for d in deltas}
    marked = {(d, s, m): 0 for d in deltas for s in grid for m in families}
    marked_ws = dict(marked)
    needed = {(d, s, m): [] for d in deltas for s in printed_at for m in families}
    seed_sd = 0.0
    most = max(grid)
    for _ in range(replicates):
        z = rng.normal(size=setting.n)
        labels = rng.integers(0, setting.classes, setting.n)
        w = bootstrap.resample_weights(setting.n, resamples, seed=int(rng.integers(1 << 31)))
        ref = [_seed_run(setting, rng, z, labels, w, ("accuracy",)) for _ in range(most)]
        seed_sd += float(np.std([v["accuracy"] for v, _ in ref], ddof=1))
        for d in deltas:
            runs = [_seed_run(better[d], rng, z, labels, w, ("accuracy",)) for _ in range(most)]
            for s in grid:
                pair = ({k: runs[k][0]["accuracy"] for k in range(s)}, {k: runs[k][1]["accuracy"] for k in range(s)},
                        {k: ref[k][0]["accuracy"] for k in range(s)}, {k: ref[k][1]["accuracy"] for k in range(s)})
                est = bootstrap.difference(*pair, paired=True)
                p, p_ws = est.p_value(), ws_p_value(est, pair[0], pair[2])
                for m in families:
                    marked[(d, s, m)] += int(est.center > 0 and p < ALPHA / m)
                    marked_ws[(d, s, m)] += int(est.center > 0 and p_ws < ALPHA / m)
                    if s in printed_at:
                        needed[(d, s, m)].append(bootstrap.seeds_needed(*pair, paired=True, family=m, alpha=ALPHA))
    return {"marked": marked, "marked_ws": marked_ws, "needed": needed, "seed_sd": seed_sd / replicates,
            "replicates": replicates}


def seeds_at_power(rates: dict[int, float], target: float = 0.8) -> float:
    """The seed count at which the power ``rates`` (seeds -> rate) first reaches ``target``,
    linearly interpolated between the grid points around it; ``inf`` if it never does."""
    before = None
    for s in sorted(rates):
        if rates[s] >= target:
            if before is None:
                return float(s)
            s0, r0 = before
            return s0 + (target - r0) / (rates[s] - r0) * (s - s0)
        before = (s, rates[s])
    return float("inf")


# ------------------------------------------------------- the l1 estimator at perfect calibration

#: Soft thresholds, in standard errors of a bin's gap, the trade-off scans (0: plug-in ECE).
THRESHOLDS = tuple(round(0.1 * i, 1) for i in range(31))
CENTRE_GOAL = 0.003  # the acceptance's bound on the debiased ECE's centre at true ECE 0 (0.3 points)


def soft_thresholded_ece(probs: np.ndarray, labels: np.ndarray, thresholds=THRESHOLDS) -> np.ndarray:
    """Plug-in ECE with each bin's gap shrunk by c of its standard errors, for each c in
    ``thresholds``: sum_b (n_b / N) max(|acc_b - conf_b| - c s_b, 0), s_b^2 = acc_b (1 - acc_b)
    / n_b (the bins and s_b of the debiased ECE); c = 0 is plug-in ECE."""
    bins = calibration_bins(probs, labels, n_bins=ECE_BINS)
    n = bins["count"].astype(np.float64)
    full = n > 0
    acc = bins["sum_acc"][full] / n[full]
    gap = np.abs(acc - bins["sum_conf"][full] / n[full])
    se = np.sqrt(acc * (1.0 - acc) / n[full])
    shrunk = np.maximum(gap[None, :] - np.asarray(thresholds)[:, None] * se[None, :], 0.0)
    return shrunk @ n[full] / n.sum()


def l1_tradeoff(settings: tuple[Setting, ...], replicates: int, seed: int = 0, thresholds=THRESHOLDS) -> dict:
    """One run's mean plug-in ECE, debiased ECE and soft-thresholded ECE (each threshold of
    ``thresholds``) over ``replicates`` simulated test sets of each setting: ``{setting name:
    {"truth": true ECE, "ece_debiased": mean, "soft": [mean per threshold]}}`` (``soft[0]``:
    plug-in ECE)."""
    rng = np.random.default_rng(seed)
    out = {}
    for setting in settings:
        debiased, soft = 0.0, np.zeros(len(thresholds))
        for _ in range(replicates):
            z = rng.normal(size=setting.n)
            labels = rng.integers(0, setting.classes, setting.n)
            probs = _predictions(setting, rng, z, labels)
            debiased += get_metric("ece_debiased")(probs, labels)
            soft += soft_thresholded_ece(probs, labels, thresholds)
        out[setting.name] = {"truth": truth(setting)["ece"], "ece_debiased": debiased / replicates,
                             "soft": soft / replicates}
    return out


# ---------------------------------------------------------------------------- the report

def _binomial_band(p: float, r: int) -> float:
    """Half-width of the 95% band of an observed rate around ``p`` after ``r`` trials."""
    return 1.96 * np.sqrt(p * (1 - p) / r)


def _pct(count: float, r: int) -> str:
    return f"{100 * count / r:.1f}"


def _head(keys: list[str], values: list[str]) -> list[str]:
    """A Markdown table's header and rule: ``keys`` left-aligned, ``values`` right-aligned."""
    return ["| " + " | ".join(keys + values) + " |", "|" + "---|" * len(keys) + "---:|" * len(values)]


def _seeds_text(value: float) -> str:
    return NOT_REACHED if np.isinf(value) else f"{value:.0f}" if value == round(value) else f"{value:.1f}"


def report(results: list[tuple[Setting, dict]], powered: tuple[Setting, dict] | None, resamples: int,
           power_resamples: int, wall: float, argv: list[str], note: str = "", tradeoff: dict | None = None) -> str:
    from machine import provenance

    r = results[0][1]["replicates"]
    lines = [
        "# Coverage of the intervals, false-positive rate and power of the marks",
        "",
        "Simulated benchmarks with a known truth (`benchmarks/coverage.py`, module docstring: images "
        "shared by every seed, seed-level variation, a known calibration map). "
        f"{r} replicates per setting, B = {resamples:,} bootstrap resamples, 10 classes. A 95% "
        f"interval should cover the truth in 95% of replicates (Monte-Carlo band at {r} replicates: "
        f"±{100 * _binomial_band(0.95, r):.1f} points); a test under the null of two identical methods "
        f"should reject at most 5% of the time (band ±{100 * _binomial_band(0.05, r):.1f} points).",
        "",
        "Interval kinds: **seeds+samples** = the report's default (`bench.analysis.bootstrap.seed_mean`: seed-level "
        "and test-sample variance, t with S - 1 df, centred on the estimate less the bootstrap's bias "
        "estimate, or on the estimate itself for a metric whose estimate is bias-corrected by construction: "
        "`ece_debiased`); **samples, seeds fixed** = percentile bootstrap over test samples with the trained "
        "seeds held fixed (`--significance samples_seeds_fixed`); **seeds only** = Student's t over the "
        "per-seed values. The default test of a difference (`bench.analysis.bootstrap.difference`) is centred on the "
        "observed difference, without the bootstrap's bias correction (two identical methods share their "
        "estimator's bias; the correction's noise made plug-in ECE's test fire in 8.7% of nulls in the "
        "5-seed same-images setting); *corrected again* below shows the debiased ECE's test with it.",
        "",
        "## Settings",
        "",
        "*Error correlation*: the measured correlation between two seeds' per-image error indicators "
        "(mean over replicates); *same images* settings make the seeds miss the same images, as in real "
        "benchmarks.",
        "",
        *_head(["setting"], ["error correlation"]),
    ]
    for setting, res in results:
        corr = "n/a" if setting.seeds == 1 else f"{res['correlation'] / r:.2f}"
        lines.append(f"| {setting.name} | {corr} |")
    lines += [
        "",
        "## Coverage of 95% intervals of the seed-mean (%, mean width in the metric's unit)",
        "",
        "*Centre*: the mean centre of the default interval.",
        "",
        *_head(["setting", "metric"], ["truth", "mean estimate", "centre", *KINDS]),
    ]
    for setting, res in results:
        for name in res["estimate"]:
            scale = get_metric(name).scale
            cells = []
            for kind in KINDS:
                if setting.seeds == 1 and kind == "seeds only":
                    cells.append("n/a")
                    continue
                cells.append(f"{_pct(res['covered'][(name, kind)], r)} ({scale * res['width'][(name, kind)] / r:.2f})")
            lines.append(f"| {setting.name} | {name} | {scale * res['truth'][name]:.2f} | "
                         f"{scale * res['estimate'][name] / r:.2f} | {scale * res['center'][name] / r:.2f} | "
                         + " | ".join(cells) + " |")
    names = list(results[0][1]["estimate"])
    lines += [
        "",
        "## False-positive rate under the null of two identical methods (% of replicates with p < 0.05)",
        "",
        "Each metric alone, and *family*: any of the metrics marked after Holm across them (the report's "
        "correction). One-run settings compare two single runs: the default test then rests on "
        "test-sample noise only (marked `△`/`▽` in a report). **WS df** is the candidate with more power: "
        "the default's estimate referred to Welch-Satterthwaite df that count the test images' part of the "
        "variance as known.",
        "",
        *_head(["setting", "test"], [*names, "family"]),
    ]
    for setting, res in results:
        for test in TESTS:
            cells = [_pct(res["rejected"][(name, test)], r) for name in names]
            lines.append(f"| {setting.name} | {test} | " + " | ".join(cells) + f" | {_pct(res['family'][test], r)} |")
    again = [n for n in names if (n, "center") in results[0][1]["again"]]
    if again:
        lines += [
            "",
            "## A metric bias-corrected by construction, with and without the bootstrap's bias correction",
            "",
            "The report centres `" + "`, `".join(again) + "` on its estimate (its record's `bias_corrected`); "
            "*corrected again* is the interval and test as they were before, centred on the estimate less the "
            "bootstrap's bias estimate. Centre in the metric's unit; coverage and false marks in %. Where the "
            "truth is 0 (calibrated) every bin's true gap is 0 and the debiased estimator keeps 2 - √2 = 0.59 of "
            "plug-in ECE's upward bias (over an observed gap g ~ N(0, s²), E[2|g| - E|g + sZ|] = "
            "(2 - √2) s √(2/π) against E|g| = s √(2/π)), which the bootstrap's correction happens to offset there.",
            "",
            *_head(["setting", "metric"], ["truth", "centre", "corrected again", "coverage", "corrected again",
                                           "false marks", "corrected again"]),
        ]
        for setting, res in results:
            for name in again:
                scale = get_metric(name).scale
                a = res["again"]
                lines.append(
                    f"| {setting.name} | {name} | {scale * res['truth'][name]:.2f} | "
                    f"{scale * res['center'][name] / r:.2f} | {scale * a[(name, 'center')] / r:.2f} | "
                    f"{_pct(res['covered'][(name, 'seeds+samples')], r)} | {_pct(a[(name, 'covered')], r)} | "
                    f"{_pct(res['rejected'][(name, 'seeds+samples')], r)} | {_pct(a[(name, 'rejected')], r)} |")
    if tradeoff:
        lines += _tradeoff_section(tradeoff, r)
    lines += _findings(results)
    if powered is not None:
        lines += _power_section(*powered, power_resamples)
    lines += ["", "## What a mark needs", "",
              "A mark needs |difference| / se above the two-sided t quantile at 0.05 / m (Holm's first step "
              "in a family of m comparisons) with S - 1 df: that many standard errors of the difference.",
              "", *_head([], ["seeds", *(f"m = {m}" for m in FAMILIES)])]
    for s in (3, 4, 5, 10):
        lines.append(f"| {s} | " + " | ".join(f"{sp.t.ppf(1 - ALPHA / (2 * m), s - 1):.1f}"
                                                for m in FAMILIES) + " |")
    lines += ["", "## Run", "", *provenance("coverage.py" + (" " + shlex.join(argv) if argv else ""),
                                         f"; wall time {wall / 60:.1f} min{note}"), ""]
    return "\n".join(lines)


def above_level(count: int, r: int, level: float = ALPHA) -> float:
    """One-sided exact binomial p-value of "the true rate is at most ``level``" after
    ``count`` rejections in ``r`` replicates: P(X >= count) for X ~ Binomial(r, level)."""
    return float(sp.binom.sf(count - 1, r, level))


def level_check(cells: list[tuple[int, int]]) -> tuple[float, int]:
    """Whether a test holds its 5% level: ``(smallest Holm-adjusted p, cells above 5% at
    family-wise 0.05)`` of :func:`above_level` over ``(rejections, replicates)`` cells.  A
    test whose true rate is exactly 5% shows rates above 5% in about half its cells (the
    Monte-Carlo error of a rate); this asks which of them are more than that error explains."""
    adjusted = bootstrap.holm([above_level(k, r) for k, r in cells])
    return float(np.min(adjusted)), int(np.sum(adjusted <= ALPHA))


def _findings(results: list[tuple[Setting, dict]]) -> list[str]:
    """What the null and the calibrated settings show, read off the results: each test's
    largest per-metric and family false-mark rate over the settings with seeds (one-run
    settings rest on test-sample noise alone), its rate pooled over those settings per
    metric, whether any cell is above 5% by more than Monte-Carlo error
    (:func:`level_check`), and the debiased ECE's centre where the truth is 0."""
    r = results[0][1]["replicates"]
    seeded = [(st, res) for st, res in results if st.seeds > 1]
    if not seeded:  # one-run settings only: no seed-aware level to read off
        return []
    names = list(results[0][1]["estimate"])
    lines = ["", "## Findings", "",
             "A test whose true rate is exactly 5% shows rates above 5% in about half the cells of the "
             f"false-positive table (band ±{100 * _binomial_band(ALPHA, r):.1f} points at {r} replicates). "
             "*Above 5%* asks an exact one-sided binomial test of \"rate at most 5%\" of each cell of the settings "
             "with seeds (per metric and family) and of each rate pooled over those settings, Holm-adjusted over "
             "all of them: a rate is above 5% only where that adjusted p-value is at most 0.05.", ""]
    held = {}
    for test in TESTS:
        cells = [(res["rejected"][(n, test)], st.name, n) for st, res in seeded for n in names]
        cells += [(res["family"][test], st.name, "family") for st, res in seeded]
        pooled = {n: sum(k for k, _, m in cells if m == n) for n in [*names, "family"]}
        trials = r * len(seeded)
        smallest, above = level_check([(k, r) for k, _, _ in cells] + [(k, trials) for k in pooled.values()])
        held[test] = above == 0
        worst = max(c for c in cells if c[2] != "family")
        family = max(c for c in cells if c[2] == "family")
        verdict = ("no cell and no pooled rate is above 5%: it holds its level" if held[test] else
                   f"{above} of them above 5%: it does not hold its level")
        lines.append(f"- **{test}**: largest false-mark rate per metric over the settings with seeds "
                     f"{_pct(worst[0], r)}% ({worst[2]}, {worst[1]}), for the family after Holm "
                     f"{_pct(family[0], r)}% ({family[1]}); pooled over the {len(seeded)} settings (%, band "
                     f"±{100 * _binomial_band(ALPHA, trials):.1f}): "
                     + ", ".join(f"{n} {_pct(k, trials)}" for n, k in pooled.items())
                     + f"; {verdict} (smallest adjusted p {smallest:.2g}).")
    lines.append(f"- The candidate with more power (WS df) {'holds' if held['WS df'] else 'does not hold'} its "
                 f"level{'' if held['WS df'] else ', so the reports keep the default test (seeds+samples)'}. A "
                 "smaller Holm family is no new test: Holm keeps the family-wise level of whatever family it is "
                 "given; the power table shows what a family of 10 instead of 60 or 90 buys.")
    for st, res in seeded:
        for name in names:
            if (name, "center") in res["again"] and res["truth"][name] < 1e-9:
                scale = get_metric(name).scale
                lines.append(f"- `{name}` where the truth is 0 ({st.name}): centre "
                             f"{scale * res['center'][name] / r:+.2f} points, "
                             f"{scale * res['again'][(name, 'center')] / r:+.2f} corrected again; false marks "
                             f"{_pct(res['rejected'][(name, 'seeds+samples')], r)}%, "
                             f"{_pct(res['again'][(name, 'rejected')], r)}% corrected again.")
    return lines


def _tradeoff_section(tradeoff: dict, r: int) -> list[str]:
    """The debiased ECE's residual bias at true ECE 0 against what a smaller one costs away
    from 0 (:func:`l1_tradeoff`), stated with the numbers."""
    (zero, at_zero), (away, at_away) = tradeoff.items()
    scale = get_metric("ece").scale
    reach = next((i for i, v in enumerate(at_zero["soft"]) if v - at_zero["truth"] <= CENTRE_GOAL), None)
    cols = [0, *([] if reach in (None, 0) else [reach])]
    lines = [
        "",
        "### The debiased ECE at perfect calibration: a property of the ℓ1 estimator",
        "",
        "In a bin with true gap g the observed gap is about ĝ ~ N(g, s²); the mean of any estimator "
        "T(ĝ) of |g| is a smooth function of g, and |g| has a corner at 0, so no estimator of |g| is "
        "unbiased both at g = 0 and away from it. The debiased ECE (Kumar et al.'s ℓ1 estimator, "
        "definition unchanged) is nearly unbiased away from 0 and keeps 59% of plug-in ECE's bias at 0. "
        "To check what a smaller bias at 0 costs, plug-in ECE with each bin's gap soft-thresholded at "
        "c standard errors (max(|ĝ| - c s, 0)), c the smallest of 0, 0.1, ..., 3 whose mean at true "
        f"ECE 0 is within {100 * CENTRE_GOAL:g} points. Mean of one run over {r} simulated test sets, "
        "in points:",
        "",
        *_head(["setting"], ["truth", "ece_debiased", *(("plug-in ECE" if i == 0 else
                                                          f"soft-thresholded, c = {THRESHOLDS[i]:g}") for i in cols)]),
    ]
    for name, res in tradeoff.items():
        lines.append(f"| {name} | {scale * res['truth']:.2f} | {scale * res['ece_debiased']:.2f} | "
                     + " | ".join(f"{scale * res['soft'][i]:.2f}" for i in cols) + " |")
    lines.append("")
    bias = scale * (at_zero["ece_debiased"] - at_zero["truth"])
    plug = scale * (at_zero["soft"][0] - at_zero["truth"])
    text = (f"At true ECE 0 ({zero}) one run's debiased ECE is {bias:+.2f} points, plug-in ECE {plug:+.2f}: the "
            f"acceptance's {100 * CENTRE_GOAL:g} points is not met by the debiased ECE")
    if reach is None:
        lines.append(text + f"; no threshold up to c = {THRESHOLDS[-1]:g} reaches it either.")
        return lines
    cost = scale * (at_away["soft"][reach] - at_away["truth"])
    kept = scale * (at_away["ece_debiased"] - at_away["truth"])
    lines.append(text + f". The soft threshold that meets it (c = {THRESHOLDS[reach]:g}) is {cost:+.2f} points off "
                 f"the truth in {away} (true ECE {scale * at_away['truth']:.2f}), where the debiased ECE is "
                 f"{kept:+.2f} off: a bias of 0.3 points at 0 is bought with a larger one away from it, so the "
                 "report keeps the debiased ECE as defined (its false marks stay at their level: table above).")
    return lines


def _power_section(setting: Setting, res: dict, resamples: int) -> list[str]:
    r = res["replicates"]
    deltas = sorted({d for d, _, _ in res["marked"]})
    grid = sorted({s for _, s, _ in res["marked"]})
    families = sorted({m for _, _, m in res["marked"]})
    printed = sorted({s for _, s, _ in res["needed"]})
    lines = [
        "",
        "## Power of a mark",
        "",
        f"`{setting.name}` (the reference; per-seed accuracy sd {100 * res['seed_sd']:.2f} points) against a "
        "method whose true accuracy is higher by the gain shown, accuracy alone, the default test (paired over "
        f"seeds), {r} replicates, B = {resamples:,}. A mark in a Holm family of m comparisons needs p < 0.05 / m "
        "(Holm's first step, which the one comparison that differs must pass): m = 1 is the test alone, "
        f"{paper_metrics()} one method's paper metrics, and each reference suite's table (its paper metrics times the "
        "methods compared with its reference): " + _suites_text() + ". "
        f"% of replicates marked (band ±{100 * _binomial_band(0.5, r):.1f} points at 50%); *WS df*: the candidate "
        "test of the false-positive table.",
        "",
        *_head(["gain (points)", "m", "test"], [f"{s} seeds" for s in grid]),
    ]
    for d in deltas:
        for m in families:
            for test, counts in (("default", res["marked"]), ("WS df", res["marked_ws"])):
                lines.append(f"| {100 * d:g} | {m} | {test} | " + " | ".join(_pct(counts[(d, s, m)], r) for s in grid)
                             + " |")
    band = _binomial_band(0.8, r)
    lines += [
        "",
        "### *Seeds needed* against the simulated seeds for 80% power",
        "",
        "*Simulated*: the seed count at which the default test's power above reaches 80% (interpolated "
        f"between grid points; `> {grid[-1]}` beyond the grid), and in brackets where it reaches 80% ∓ "
        f"{100 * band:.1f} points (the Monte-Carlo band of a rate at {r} replicates). *Printed*: the median over "
        "replicates of what `bench.analysis.bootstrap.seeds_needed` (the report's *Seeds needed*, for a family of m) "
        "prints from the seeds shown, its ratio to the simulated count and, after the semicolon, the ratio's "
        "Monte-Carlo band (the median's distribution-free 95% interval over the simulated count's band). "
        "`seeds_needed` takes the seed spread's "
        "standard deviation as s / c4 (unbiased; c4 = 0.886 for 3 seeds), so the spread measured on 2 df no longer "
        "lowers the count in most draws.",
        "",
        *_head(["gain (points)", "m"], ["simulated", *(f"printed from {s} seeds (ratio)" for s in printed)]),
    ]
    ratios = []
    for d in deltas:
        for m in families:
            rates = {s: res["marked"][(d, s, m)] / r for s in grid}
            target = seeds_at_power(rates)
            cells = []
            around = [seeds_at_power(rates, 0.8 + b) for b in (-band, band)]
            for s in printed:
                median, (low, high) = median_band(res["needed"][(d, s, m)])
                ratio = median / target if np.isfinite(target) and np.isfinite(median) else float("nan")
                lowest, highest = low / around[1], high / around[0]  # the ratio's Monte-Carlo band
                if np.isfinite(target):
                    ratios.append((ratio, lowest, highest))
                cells.append(f"{_seeds_text(median)} ({ratio:.2f}; {lowest:.2f}-{highest:.2f})"
                             if np.isfinite(ratio) else _seeds_text(median))
            sim = (f"> {grid[-1]}" if np.isinf(target) else
                   f"{target:.1f} ({around[0]:.1f}-" + (f"> {grid[-1]}" if np.isinf(around[1]) else f"{around[1]:.1f}")
                   + ")")
            lines.append(f"| {100 * d:g} | {m} | {sim} | " + " | ".join(cells) + " |")
    if ratios:
        low, high = min(r for r, _, _ in ratios), max(r for r, _, _ in ratios)
        within = np.isfinite(low) and 0.8 <= low and high <= 1.2
        outside = [(r, lo, hi) for r, lo, hi in ratios if not 0.8 <= r <= 1.2]
        lines += ["", f"Printed over simulated in every cell with a finite simulated count: {low:.2f}-{high:.2f}, "
                  + ("within ±20%." if within else
                     f"not within ±20% in {len(outside)} cell{'s' if len(outside) > 1 else ''}, of which "
                     f"{sum(not (hi < 0.8 or lo > 1.2) for _, lo, hi in outside)} within it inside the Monte-Carlo "
                     "band.")]
    return lines


def median_band(values: list[float], level: float = 0.95) -> tuple[float, tuple[float, float]]:
    """The median of ``values`` and its distribution-free ``level`` interval: the order
    statistics whose ranks bracket the median with Binomial(R, 1/2) probability ``level``:
    ranks k and R + 1 - k (1-based; the binomial is symmetric), k its (1 - level) / 2 quantile
    (NaN values, where nothing varied, are left out)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    x = x[~np.isnan(x)]
    if not x.size:
        return float("nan"), (float("nan"), float("nan"))
    k = max(1, int(sp.binom.ppf((1 - level) / 2, x.size, 0.5)))
    return float(np.median(x)), (float(x[k - 1]), float(x[x.size - k]))


def _suites_text() -> str:
    """The reference suites grouped by their Holm family size: ``60 (default, text), 90 (zoo)``."""
    by_size: dict[int, list[str]] = {}
    for name, m in suite_families().items():
        by_size.setdefault(m, []).append(name)
    return ", ".join(f"{m} ({', '.join(names)})" for m, names in sorted(by_size.items()))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicates", type=int, default=300)
    ap.add_argument("--resamples", type=int, default=bootstrap.DEFAULT_RESAMPLES)
    ap.add_argument("--power-replicates", type=int, default=300, help="0: no power study")
    ap.add_argument("--power-resamples", type=int, default=200)
    ap.add_argument("--settings", default="", help="comma-separated indices into SETTINGS (default: all)")
    ap.add_argument("--note", default="", help="a remark for the Run section (e.g. that the machine was loaded)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "perf" / "coverage.md")
    args = ap.parse_args(argv)
    picked = args.settings.split(",") if args.settings else [str(i) for i in range(len(SETTINGS))]
    if not all(i.strip().isdigit() and int(i) < len(SETTINGS) for i in picked):
        ap.error(f"--settings takes indices 0-{len(SETTINGS) - 1} into SETTINGS, got {args.settings!r}")
    chosen = [SETTINGS[int(i)] for i in picked]
    started = time.perf_counter()
    results = []
    for i, setting in enumerate(chosen):
        t0 = time.perf_counter()
        results.append((setting, simulate(setting, args.replicates, args.resamples, seed=i)))
        print(f"{setting.name}: {time.perf_counter() - t0:.0f} s", flush=True)
    tradeoff = l1_tradeoff(TRADEOFF_SETTINGS, args.replicates)
    powered = None
    if args.power_replicates > 0:
        t0 = time.perf_counter()
        powered = (POWER_SETTING, power(POWER_SETTING, args.power_replicates, args.power_resamples))
        print(f"power: {time.perf_counter() - t0:.0f} s", flush=True)
    text = report(results, powered, args.resamples, args.power_resamples, time.perf_counter() - started,
                  sys.argv[1:] if argv is None else argv, f"; {args.note}" if args.note else "", tradeoff)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
