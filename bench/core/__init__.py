"""What every stage uses: the errors (with their one-line messages), the registries of methods, data sets, attention layers, metrics, OOD scores and executors, and progress on the console."""
