"""Report table formats (:data:`FORMATS`): a :class:`~bench.report.tables.Table` as
GitHub Markdown, LaTeX (booktabs; best mean per column in bold, marks as arrows) or CSV
(raw, unscaled values) text.
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

import pandas as pd
from tabulate import tabulate

from bench.core.errors import ConfigError
from bench.core.registry import did_you_mean
from bench.report.rows import NO_STAT
from bench.report.tables import Column, Table

FORMATS = ("md", "tex", "csv")
MD_MARKS = {"better": " ▲", "worse": " ▼", "better (one run)": " △", "worse (one run)": " ▽"}
TEX_MARKS = {"better": r"$^\uparrow$", "worse": r"$^\downarrow$",
             "better (one run)": r"$^{(\uparrow)}$", "worse (one run)": r"$^{(\downarrow)}$"}
CSV_FLOAT_FORMAT = "%.10g"


def validate_formats(formats: Sequence[str]) -> tuple[str, ...]:
    """``formats`` checked against :data:`FORMATS`, repeats dropped, order kept; any unknown
    one is a ConfigError that lists them.  Called where formats enter the report (``--format``
    through :class:`bench.run.report.ReportOptions`, :func:`bench.report.write_report`)."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ConfigError(f"unknown report format(s) {unknown}{did_you_mean(unknown[0], FORMATS)}; known: "
                          f"{', '.join(FORMATS)}")
    return tuple(dict.fromkeys(formats))


def md_escape(text: str) -> str:
    return text.replace("|", r"\|").replace("\n", " ")


def to_markdown(table: Table, drop_dataset: bool = False) -> str:
    """GitHub pipe table (or the table's "no rows" sentence); the README drops ``Dataset``."""
    if not table.rows:
        return table.spec.empty + "\n"
    skip = 1 if drop_dataset else 0
    headers = table.key_headers[skip:] + [c.header for c in table.columns]
    body = []
    for row in table.rows:
        cells = [md_escape(k) for k in table.key_texts(row)[skip:]]
        for col in table.columns:
            text, verdict = table.value(row, col)
            cells.append(text + MD_MARKS.get(verdict, ""))
        body.append(cells)
    colalign = ("left",) * (len(table.key_headers) - skip) + ("right",) * len(table.columns)
    return tabulate(body, headers=headers, tablefmt="pipe", disable_numparse=True,
                    colalign=colalign) + "\n"


_TEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def tex_header(col: Column) -> str:
    """A column's header in LaTeX: ``x1000`` units as ``$\\times$1000``."""
    if not col.unit:
        return tex_escape(col.label)
    unit = r"$\times$" + col.unit[1:] if re.fullmatch(r"x\d+", col.unit) else tex_escape(col.unit)
    return f"{tex_escape(col.label)} ({unit})"


def tex_escape(text: str) -> str:
    """Escape LaTeX special characters; ``±``, ``≈`` and ``†`` become ``$\\pm$``,
    ``$\\approx$`` and ``$^\\dagger$``."""
    out = "".join(_TEX_SPECIAL.get(ch, ch) for ch in text)
    return out.replace("±", r"$\pm$").replace("≈", r"$\approx$").replace("†", r"$^\dagger$")


def to_latex(table: Table) -> str:
    """booktabs tabular; best mean per column and row group in bold, marks as arrows."""
    head = f"% uqbench table '{table.spec.name}'; needs \\usepackage{{booktabs}}"
    if not table.rows:
        return f"{head}\n% {table.spec.empty}\n"
    best = table.best()
    keys = table.key_headers
    lines = [
        head,
        r"\begin{tabular}{" + "l" * len(keys) + "r" * len(table.columns) + "}",
        r"\toprule",
        " & ".join([tex_escape(k) for k in keys] + [tex_header(c) for c in table.columns]) + r" \\",
        r"\midrule",
    ]
    previous = None
    for i, row in enumerate(table.rows):
        if previous is not None and row.dataset != previous:
            lines.append(r"\midrule")
        previous = row.dataset
        cells = [tex_escape(k) for k in table.key_texts(row)]
        for j, col in enumerate(table.columns):
            text, verdict = table.value(row, col)
            text = tex_escape(text)
            cells.append((r"\textbf{" + text + "}" if best[i, j] else text) + TEX_MARKS.get(verdict, ""))
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def to_csv(table: Table) -> str:
    """Raw (unscaled) values: keys, ``n_seeds``, ``<metric>_<stat>`` per metric column
    (:attr:`Column.csv_name`: the metric it shows; stats: the spec's ``csv_stats``) and one
    column per fixed column (``ce``, efficiency fields).  Undefined numbers are ``nan``; a missing verdict is empty; severity ``-1`` is
    the average over every corruption split.
    """
    spec = table.spec
    keys = ["dataset", "method"] + [k for _, k in spec.keys] + ["n_seeds"]
    values = [f"{c.csv_name}_{s}" for c in table.metric_columns for s in spec.csv_stats]
    values += [c.key for c in spec.extra]
    records = []
    for row in table.rows:
        rec: dict[str, object] = {"dataset": row.dataset, "method": row.method, "n_seeds": row.n_seeds}
        rec.update(zip(keys[2:], row.keys))
        for c in table.metric_columns:
            stat = row.stats.get(c.key, NO_STAT)
            rec.update({f"{c.csv_name}_{s}": getattr(stat, s) for s in spec.csv_stats})
        for c in spec.extra:
            rec[c.key] = row.stats.get(c.key, NO_STAT).mean
        records.append(rec)
    frame = pd.DataFrame.from_records(records, columns=keys + values)
    floats = [c for c in values if not c.endswith(("_verdict", "_test"))]
    frame = frame.astype({"n_seeds": "int64"} | {c: "float64" for c in floats})
    return frame.to_csv(index=False, float_format=CSV_FLOAT_FORMAT, na_rep="nan", lineterminator="\n")


_RENDERERS: dict[str, Callable[[Table], str]] = {"md": to_markdown, "tex": to_latex, "csv": to_csv}


def render(table: Table, fmt: str) -> str:
    """One table as ``md``, ``tex`` or ``csv`` text."""
    return _RENDERERS[fmt](table)
