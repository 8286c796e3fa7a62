"""Coverage of the report's intervals and false-positive rate of its marks, by simulation.

Predictions are simulated with a known ground truth in the design of a real benchmark: N
test images shared by every seed (crossed), S seeds per method, and seed-level variation.

* Image i: a difficulty z_i ~ N(0, 1) and a label y_i, the same for every seed and method.
* Seed s: a skill a_s ~ N(skill, seed_sd^2).  Its margin on image i is
  m = a_s + z_i + e_si with its own noise e_si ~ N(0, 1).
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
``bench.stats.seed_mean``), ``samples, seeds fixed`` (the percentile bootstrap over test
samples, the ``samples_seeds_fixed`` option) and ``seeds only`` (Student's t over the S
per-seed values, ignoring test-sample noise).  Under the null of two identical methods
(same settings, their own seeds, the same test images), it records how often the test
behind a mark gives p < 0.05: the default ``bench.stats.difference`` (paired over seed
ids, as the report pairs two trained methods) and the seeds-fixed z-test, per metric and
for the family (any mark after Holm over the metrics).

    nice -n 10 .venv/bin/python benchmarks/coverage.py [--replicates 300] [--resamples 1000]

writes ``reports/perf/coverage.md``.  ``tests/benchmarks/test_coverage.py`` runs a small version.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core per process, before numpy loads its BLAS

import numpy as np  # noqa: E402
from scipy import stats as sp  # noqa: E402
from scipy.special import expit  # noqa: E402

from bench import stats  # noqa: E402
from bench.metrics import get_metric  # noqa: E402

METRICS = ("accuracy", "nll", "aurc", "ece", "ece_debiased")
KINDS = ("seeds+samples", "samples, seeds fixed", "seeds only")
LEVEL = 0.95
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

    def confidence(self, m: np.ndarray) -> np.ndarray:
        return 1.0 / self.classes + (1.0 - 1.0 / self.classes) * expit(m)

    def correct_probability(self, m: np.ndarray) -> np.ndarray:
        return 1.0 / self.classes + (1.0 - 1.0 / self.classes) * expit(self.temperature * m)


SETTINGS = (
    Setting("acc 0.86, N 1000, 3 seeds, overconfident"),
    Setting("acc 0.86, N 1000, 5 seeds, overconfident", seeds=5),
    Setting("acc 0.48, N 1000, 3 seeds, overconfident", skill=-0.5),
    Setting("acc 0.86, N 1000, 3 seeds, calibrated", skill=2.26, temperature=1.0),
    Setting("acc 0.86, N 3000, 3 seeds, overconfident", n=3000),
    Setting("acc 0.86, N 1000, 3 seeds, no seed variation", seed_sd=0.0),
    Setting("acc 0.86, N 1000, one run, overconfident", seeds=1),
)


# ---------------------------------------------------------------------------- the truth

def _population(setting: Setting, skill: float, points: int = 20001) -> dict[str, float]:
    """Population metrics of one seed with this skill (quadrature over its margin m ~
    N(skill, 2): image difficulty and its own noise)."""
    x = np.linspace(-9.0, 9.0, points)
    m = skill + np.sqrt(2.0) * x
    w = sp.norm.pdf(x) * (x[1] - x[0])
    w /= w.sum()
    c, f, k = setting.confidence(m), setting.correct_probability(m), setting.classes
    out = {
        "accuracy": float(np.sum(w * f)),
        "nll": float(np.sum(w * (f * -np.log(c) + (1 - f) * -np.log((1 - c) / (k - 1))))),
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


# ----------------------------------------------------------------------- the simulation

def _predictions(setting: Setting, rng: np.random.Generator, z: np.ndarray, labels: np.ndarray):
    """One seed's probabilities [N, K] on the shared images."""
    n, k = z.shape[0], setting.classes
    m = rng.normal(setting.skill, setting.seed_sd) + z + rng.normal(size=n)
    c = setting.confidence(m)
    correct = rng.random(n) < setting.correct_probability(m)
    predicted = np.where(correct, labels, (labels + rng.integers(1, k, n)) % k)
    probs = np.repeat(((1 - c) / (k - 1))[:, None], k, axis=1)
    probs[np.arange(n), predicted] = c
    return probs


def simulate(setting: Setting, replicates: int, resamples: int, metrics=METRICS, seed: int = 0) -> dict:
    """Coverage and null rejection counts over ``replicates`` simulated benchmarks.

    Returns ``{"truth": {metric: value}, "covered": {(metric, kind): count},
    "width": {(metric, kind): summed width}, "estimate": {metric: summed seed-mean},
    "rejected": {(metric, test): count}, "family": {test: count}, "replicates": R}``."""
    rng = np.random.default_rng(seed)
    target = truth(setting)
    covered = {(m, k): 0 for m in metrics for k in KINDS}
    width = {(m, k): 0.0 for m in metrics for k in KINDS}
    estimate = dict.fromkeys(metrics, 0.0)
    tests = ("seeds+samples", "samples, seeds fixed")
    rejected = {(m, t): 0 for m in metrics for t in tests}
    family = dict.fromkeys(tests, 0)
    for _ in range(replicates):
        z = rng.normal(size=setting.n)
        labels = rng.integers(0, setting.classes, setting.n)
        w = stats.resample_weights(setting.n, resamples, seed=int(rng.integers(1 << 31)))
        units, boots = {}, {}
        for method in ("a", "b"):  # two identical methods, each with its own seeds
            for s in range(setting.seeds):
                probs = _predictions(setting, rng, z, labels)
                for name in metrics:
                    units.setdefault((method, name), {})[s] = get_metric(name)(probs, labels)
                    boots.setdefault((method, name), {})[s] = stats.boot_metric(name, probs, labels, w)
        p_values = {t: [] for t in tests}
        for name in metrics:
            u, b = units[("a", name)], boots[("a", name)]
            values = np.array(list(u.values()))
            estimate[name] += float(values.mean())
            dist = stats.seed_mean_distribution(list(b.values()))
            intervals = {
                "seeds+samples": stats.seed_mean(u, b).interval(LEVEL),
                "samples, seeds fixed": stats.bootstrap_ci(dist, LEVEL),
                "seeds only": (sp.t.interval(LEVEL, len(values) - 1, loc=values.mean(), scale=sp.sem(values))
                               if len(values) > 1 else (np.nan, np.nan)),
            }
            for kind, (lo, hi) in intervals.items():
                covered[(name, kind)] += int(lo <= target[name] <= hi)
                width[(name, kind)] += float(hi - lo)
            ub, bb = units[("b", name)], boots[("b", name)]
            p_two = stats.difference(u, b, ub, bb, paired=True).p_value()
            dist_b = stats.seed_mean_distribution(list(bb.values()))
            p_fixed = stats.paired_z_test(dist - dist_b, float(values.mean() - np.mean(list(ub.values()))))
            for test, p in (("seeds+samples", p_two), ("samples, seeds fixed", p_fixed)):
                rejected[(name, test)] += int(p < 0.05)
                p_values[test].append(p)
        for test in tests:
            family[test] += int(np.nanmin(stats.holm(p_values[test])) < 0.05)
    return {"truth": target, "covered": covered, "width": width, "estimate": estimate,
            "rejected": rejected, "family": family, "replicates": replicates}


# ---------------------------------------------------------------------------- the report

def _binomial_band(p: float, r: int) -> float:
    """Half-width of the 95% band of an observed rate around ``p`` after ``r`` trials."""
    return 1.96 * np.sqrt(p * (1 - p) / r)


def report(results: list[tuple[Setting, dict]], resamples: int, wall: float, argv: list[str]) -> str:
    from machine import provenance

    r = results[0][1]["replicates"]
    lines = [
        "# Coverage of the intervals and false-positive rate of the marks",
        "",
        "Simulated benchmarks with a known truth (`benchmarks/coverage.py`, module docstring: images "
        "shared by every seed, seed-level variation, a known calibration map). "
        f"{r} replicates per setting, B = {resamples:,} bootstrap resamples, 10 classes. A 95% "
        f"interval should cover the truth in 95% of replicates (Monte-Carlo band at {r} replicates: "
        f"±{100 * _binomial_band(0.95, r):.1f} points); a test under the null of two identical methods "
        f"should reject at most 5% of the time (band ±{100 * _binomial_band(0.05, r):.1f} points).",
        "",
        "Interval kinds: **seeds+samples** = the report's default (`bench.stats.seed_mean`: seed-level "
        "and test-sample variance, bootstrap bias removed, t with S - 1 df); **samples, "
        "seeds fixed** = percentile bootstrap over test samples with the trained seeds held fixed "
        "(`--significance samples_seeds_fixed`); **seeds only** = Student's t over the per-seed values.",
        "",
        "## Coverage of 95% intervals of the seed-mean (%, mean width in the metric's unit)",
        "",
        "| setting | metric | truth | mean estimate | " + " | ".join(KINDS) + " |",
        "|---|---|---:|---:|" + "---:|" * len(KINDS),
    ]
    for setting, res in results:
        for name in res["truth"]:
            if name not in res["estimate"]:
                continue
            scale = get_metric(name).scale
            cells = []
            for kind in KINDS:
                if setting.seeds == 1 and kind == "seeds only":
                    cells.append("n/a")
                    continue
                cov = 100 * res["covered"][(name, kind)] / r
                cells.append(f"{cov:.1f} ({scale * res['width'][(name, kind)] / r:.2f})")
            lines.append(f"| {setting.name} | {name} | {scale * res['truth'][name]:.2f} | "
                         f"{scale * res['estimate'][name] / r:.2f} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## False-positive rate under the null of two identical methods (% of replicates with p < 0.05)",
        "",
        "Each metric alone, and *family*: any of the metrics marked after Holm across them (the report's "
        "correction). One-run settings compare two single runs: the default test then rests on "
        "test-sample noise only (marked `△`/`▽` in a report).",
        "",
        "| setting | test | " + " | ".join(results[0][1]["estimate"]) + " | family |",
        "|---|---|" + "---:|" * (len(results[0][1]["estimate"]) + 1),
    ]
    for setting, res in results:
        for test in ("seeds+samples", "samples, seeds fixed"):
            cells = [f"{100 * res['rejected'][(name, test)] / r:.1f}" for name in res["estimate"]]
            lines.append(f"| {setting.name} | {test} | " + " | ".join(cells) +
                         f" | {100 * res['family'][test] / r:.1f} |")
    lines += ["", "## Run", "", *provenance("coverage.py" + (" " + " ".join(argv) if argv else ""),
                                         f"; wall time {wall / 60:.1f} min"), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicates", type=int, default=300)
    ap.add_argument("--resamples", type=int, default=stats.DEFAULT_RESAMPLES)
    ap.add_argument("--settings", default="", help="comma-separated indices into SETTINGS (default: all)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "perf" / "coverage.md")
    args = ap.parse_args(argv)
    chosen = [SETTINGS[int(i)] for i in args.settings.split(",")] if args.settings else list(SETTINGS)
    started = time.perf_counter()
    results = []
    for i, setting in enumerate(chosen):
        t0 = time.perf_counter()
        results.append((setting, simulate(setting, args.replicates, args.resamples, seed=i)))
        print(f"{setting.name}: {time.perf_counter() - t0:.0f} s", flush=True)
    text = report(results, args.resamples, time.perf_counter() - started, sys.argv[1:] if argv is None else argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
