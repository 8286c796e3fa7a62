"""The commands: the command line (:mod:`bench.run.cli`, one module per command in :mod:`bench.run.commands`), the runner and executors that run a plan's cells, and the report and compare steps."""
