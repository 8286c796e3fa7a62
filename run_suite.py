#!/usr/bin/env python
"""uqbench entry point: ``python run_suite.py [run|report|list] [options]`` (see bench/run/cli.py)."""
import sys

from bench.run.cli import main

if __name__ == "__main__":
    sys.exit(main())
