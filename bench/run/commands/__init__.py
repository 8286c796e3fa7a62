"""The commands of ``run_suite.py``, one module each: its subparser (``add``), its
handler (``main``) and its one-line help (``HELP``); :mod:`bench.run.cli` builds the
parser from them and dispatches."""
