#!/usr/bin/env python
"""uqbench entry point: ``python run_suite.py [run|report|list] [options]`` (see bench/cli.py)."""
import sys

from bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
