"""What the tests of the docs' examples share: the run of ``docs/add-a-method.md``, whose
report ``docs/read-a-report.md`` also reads."""
from __future__ import annotations

import pytest

from tests.helpers.docs import example, reader_folder, run_commands
from tests.helpers.suites import tiny_suite

#: the evaluation splits of the doc runs: a test, two shifted and an OOD split
SPLITS = ["test", "shift/gaussian_noise/5", "shift/contrast/5", "ood/uniform_noise"]


@pytest.fixture(scope="package")
def method_run(tmp_path_factory):
    """``docs/add-a-method.md``'s files saved and its commands run, with its suite part in
    the tiny suite as ``my_suite.toml``: the folder and each command's standard output."""
    import torch

    root = tmp_path_factory.mktemp("add_a_method")
    doc = example("add-a-method.md")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models train fastest on one thread
    try:
        with reader_folder(root):
            doc.write(root)
            (root / "my_suite.toml").write_text(tiny_suite(None, methods=doc.parts["methods"], data={"splits": SPLITS}))
            outputs = run_commands(doc.commands)
    finally:
        torch.set_num_threads(threads)
    return root, outputs
