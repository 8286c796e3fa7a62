"""One cell on several processes (``torchrun``, DistributedDataParallel), on the CPU with
the gloo backend: 2 processes train like 1 (loss curve, weights, the KSVD term's global
mean), and ``torchrun ... run_suite.py`` stores each cell once, from rank 0, and every
rank has ended its process group when it exits."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import methods  # noqa: F401  (registers the methods)
from bench.train import distributed
from bench.core.registry import METHODS
from bench.config.spec import ModelConfig, TrainConfig
from bench.train.loop import fit, seed_everything
from tests.helpers import REPO
from tests.helpers.suites import tiny_suite
from tests.helpers.synthetic import squares_bundle

MODEL = ModelConfig(patch_size=5, dim=16, depth=2, heads=2, mlp_ratio=1.0, dropout=0.0)
TRAIN = TrainConfig(epochs=3, batch_size=30, lr=3e-3, warmup_epochs=1, augment=("flip",))


def _join(rank: int, size: int, rendezvous: str) -> None:
    """Join a gloo group through a file (no port to race for)."""
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=size)


def _train(name: str, device=torch.device("cpu")):
    """Train ``name`` with no sampling noise (dropout 0, GP layers at their posterior mean
    in training), so one and two processes see the same computation; returns the result."""
    torch.set_num_threads(1)
    data = squares_bundle((150, 60, 60), 0)
    method = METHODS.get(name)(METHODS.get(name).Options())
    seed_everything(0)
    model = method.build_model(MODEL, data)
    for m in model.modules():
        if hasattr(m, "sample"):
            m.sample = False
    return fit(method, model, data, TRAIN, device, seed=0)


def _rank(rank: int, size: int, rendezvous: str, name: str, out: str) -> None:
    _join(rank, size, rendezvous)
    try:
        result = _train(name)
        if rank == 0:
            torch.save({"log": result.log, "state": result.state_dict}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["msp", "kep_svgp", "sgpa", "sngp"])
def test_two_processes_train_like_one(name, tmp_path):
    """The 2-process run's training loss per epoch equals the 1-process run's (relative
    1e-5: the global batch's loss is summed in another order) and so do its final weights;
    KEP-SVGP's J² is taken of the global batch's mean (not each rank's), SNGP's precision
    matrix (in the state) sums the features of the global batch."""
    one = _train(name)
    out = tmp_path / "two.pt"
    mp.spawn(_rank, args=(2, str(tmp_path / "rendezvous"), name, str(out)), nprocs=2, join=True)
    two = torch.load(out, weights_only=True)
    assert len(two["log"]) == len(one.log) == TRAIN.epochs
    for a, b in zip(one.log, two["log"]):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)
        assert b["train_acc"] == a["train_acc"]
        assert b["val_acc"] == pytest.approx(a["val_acc"], abs=1 / 60)  # rank 0 validates (nearly) the same weights
    # weights: Adam's normalised step turns round-off in near-zero gradients into up to lr
    # per step in single entries, so compare the whole vector: relative distance < 1e-3
    w1 = torch.cat([v.flatten().double() for v in one.state_dict.values()])
    w2 = torch.cat([two["state"][k].flatten().double() for k in one.state_dict])
    assert float((w2 - w1).norm() / w1.norm()) < 1e-3


def _batch_mean_rank(rank: int, size: int, rendezvous: str, out: str) -> None:
    _join(rank, size, rendezvous)
    try:
        values = torch.arange(6.0).view(2, 3)[rank : rank + 1].clone().requires_grad_()  # rank r: row r
        weights = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])[rank : rank + 1]
        mean = distributed.batch_mean(values, weights)
        mean.pow(2).backward()
        torch.save({"mean": mean.detach(), "grad": values.grad}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_batch_mean_is_the_global_weighted_mean_with_its_gradient(tmp_path):
    """Rows [0,1,2] (weights 1,1,0) and [3,4,5] (weights 1,0,0) on two ranks: the mean is
    (0+1+3)/3 on both, and each rank's own values get the gradient of the two ranks'
    losses mean², 2 x 2·mean·w/3, which DDP's averaging over the 2 ranks turns into the
    single-process gradient."""
    mp.spawn(_batch_mean_rank, args=(2, str(tmp_path / "rendezvous"), str(tmp_path / "bm")), nprocs=2, join=True)
    mean = 4.0 / 3.0
    for rank, w in enumerate(([1.0, 1.0, 0.0], [1.0, 0.0, 0.0])):
        got = torch.load(f"{tmp_path / 'bm'}.{rank}", weights_only=True)
        assert float(got["mean"]) == pytest.approx(mean)
        np.testing.assert_allclose(got["grad"].numpy()[0], 2 * (2 * mean * np.array(w) / 3), rtol=1e-6)


TINY_DDP_SUITE = tiny_suite("tiny_ddp", train={"epochs": 2}, model={"dropout": 0.0})


def _run(root: Path, *launcher: str) -> tuple[subprocess.CompletedProcess, Path]:
    root.mkdir(parents=True, exist_ok=True)
    suite = root / "tiny_ddp.toml"
    suite.write_text(TINY_DDP_SUITE)
    results = root / "results"
    proc = subprocess.run([sys.executable, *launcher, "run_suite.py", "--suite", str(suite), "--results", str(results),
                           "--reports", str(root / "reports"), "--device", "cpu"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return proc, results / "tiny_ddp"


def test_torchrun_trains_a_cell_on_two_processes_and_stores_it_once(tmp_path):
    """``torchrun --nproc_per_node 2 run_suite.py``: exit 0, one complete cell whose
    training log matches the one-process run's, predictions equal within float tolerance,
    and a report (rank 0's)."""
    proc, store = _run(tmp_path / "two", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 torchrun processes" in proc.stderr + proc.stdout
    cells = [c for c in store.iterdir() if c.is_dir() and not c.name.startswith(".")]
    assert len(cells) == 1
    assert json.loads((cells[0] / "cell.json").read_text())["status"] == "complete"
    assert (tmp_path / "two" / "reports" / "tiny_ddp" / "README.md").is_file()

    single, store1 = _run(tmp_path / "one")
    assert single.returncode == 0, single.stderr
    (cell1,) = [c for c in store1.iterdir() if c.is_dir() and not c.name.startswith(".")]
    assert cell1.name == cells[0].name  # the same cell key: DDP is not a setting of the cell

    def losses(cell):
        return [float(r.split(",")[2]) for r in (cell / "train_log.csv").read_text().splitlines()[1:]]

    np.testing.assert_allclose(losses(cells[0]), losses(cell1), rtol=1e-5)
    with np.load(cells[0] / "preds" / "test.npz") as a, np.load(cell1 / "preds" / "test.npz") as b:
        np.testing.assert_allclose(a["log_probs"], b["log_probs"], atol=1e-4)


def test_torchrun_with_another_executor_is_a_config_error(tmp_path):
    """Each rank stops with the config error before anything trains (torchrun then exits 1)."""
    suite = tmp_path / "tiny_ddp.toml"
    suite.write_text(TINY_DDP_SUITE)
    bad = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "run_suite.py", "--suite", str(suite), "--results", str(tmp_path / "r"),
                          "--executor", "processes", "--device", "cpu"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0
    assert "use --executor local" in bad.stderr + bad.stdout
    assert not (tmp_path / "r" / "tiny_ddp").exists() or not any((tmp_path / "r" / "tiny_ddp").glob("*/cell.json"))


FAILING_PLUGIN = '''\
"""A method whose training fails on one torchrun rank only (at its 3rd step)."""
import torch.distributed as dist

from bench.core.registry import METHODS
from methods.msp import MSP


@METHODS.register("fails_on_rank")
class FailsOnRank(MSP):
    steps = 0

    def training_loss(self, model, logits, labels):
        FailsOnRank.steps += 1
        if dist.get_rank() == int(__import__("os").environ["FAIL_RANK"]) and FailsOnRank.steps == 3:
            raise RuntimeError("injected failure")
        return super().training_loss(model, logits, labels)
'''


def _torchrun_with_plugin(tmp_path: Path, suite: str, plugin: str, source: str, timeout: int,
                          **env: str) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 2 run_suite.py --plugin <plugin>`` on the suite text
    ``suite``, the plugin module's ``source`` written to ``tmp_path``, with ``env`` added
    to the environment; results and reports under ``tmp_path``."""
    (tmp_path / f"{plugin}.py").write_text(source)
    (tmp_path / "tiny_ddp.toml").write_text(suite)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "run_suite.py", "--suite", str(tmp_path / "tiny_ddp.toml"), "--results",
                           str(tmp_path / "results"), "--reports", str(tmp_path / "reports"), "--device", "cpu",
                           "--plugin", plugin], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_failure_on_one_rank_stops_every_rank(tmp_path, rank):
    """One rank failing mid-training (rank 0: the runner; rank 1: a follower) ends the
    whole torchrun job promptly (no rank left waiting in a collective) with a non-zero
    status, and the cell is not complete (rank 0 marks it failed when it is the one)."""
    proc = _torchrun_with_plugin(tmp_path, TINY_DDP_SUITE.replace("[methods.msp]", "[methods.fails_on_rank]"),
                                 "fails_plugin", FAILING_PLUGIN, 120, FAIL_RANK=str(rank))
    assert proc.returncode != 0
    assert "injected failure" in proc.stdout + proc.stderr
    infos = [json.loads(f.read_text()) for f in (tmp_path / "results" / "tiny_ddp").glob("*/cell.json")]
    assert len(infos) == 1 and infos[0]["status"] != "complete"
    if rank == 0:
        assert infos[0]["status"] == "failed" and "injected failure" in infos[0]["reason"]


def _kill_all(marker: str) -> None:
    """SIGKILL every process whose command line mentions ``marker``."""
    import signal

    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                os.kill(int(pid), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def test_a_torchrun_cell_killed_mid_training_resumes_on_every_rank(tmp_path):
    """SIGKILL a torchrun job right after rank 0 saved a training state; the next torchrun
    resumes the cell on both ranks (rank 0 hands its state to the follower) and ends with
    the weights of an uninterrupted torchrun run (within float tolerance)."""
    import signal
    import time

    suite = tmp_path / "tiny_ddp.toml"
    suite.write_text(tiny_suite("tiny_ddp", train={"epochs": 40, "checkpoint_every": 1}, model={"dropout": 0.0}))

    def command(results: str) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "run_suite.py",
                "--suite", str(suite), "--results", str(tmp_path / results), "--reports", str(tmp_path / f"r{results}"),
                "--device", "cpu"]

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    whole = subprocess.run(command("a"), cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert whole.returncode == 0, whole.stderr
    proc = subprocess.Popen(command("b"), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        states = list((tmp_path / "b").rglob("train_state.pt"))
        try:
            if states and torch.load(states[0], weights_only=True)["epoch"] >= 3:
                _kill_all(str(tmp_path / "b"))  # torchrun and both ranks (torchrun's workers have their own sessions)
                break
        except (OSError, RuntimeError, EOFError):  # the state is being replaced: look again
            pass
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    again = subprocess.run(command("b"), cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr
    assert "resuming from epoch" in again.stdout + again.stderr, again.stderr

    def cell(root: Path) -> Path:
        (c,) = [p for p in (root / "tiny_ddp").iterdir() if p.is_dir() and not p.name.startswith(".")]
        return c

    assert json.loads((cell(tmp_path / "b") / "cell.json").read_text())["resumed_from_epoch"] >= 3
    a = torch.load(cell(tmp_path / "a") / "checkpoint.pt", weights_only=True)
    b = torch.load(cell(tmp_path / "b") / "checkpoint.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6)


THREADS_PLUGIN = '''\
"""At this process's exit (after the run returned): the names of its threads, in a file per rank."""
import atexit
import os
from pathlib import Path


def _threads():
    names = sorted(Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task"))
    Path(os.environ["THREADS_OUT"], f"threads.{os.environ['RANK']}").write_text("\\n".join(names))


atexit.register(_threads)
'''


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the threads of a process from /proc")
def test_every_torchrun_rank_ends_its_process_group_before_exit(tmp_path):
    """When ``run`` returns, no thread of the process group (gloo's) runs on either rank:
    the group was destroyed, not left to the interpreter's exit, where its threads can
    abort the process ("terminate called without an active exception")."""
    proc = _torchrun_with_plugin(tmp_path, tiny_suite("tiny_ddp", model={"dropout": 0.0}), "threads_plugin",
                                 THREADS_PLUGIN, 300, THREADS_OUT=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        threads = (tmp_path / f"threads.{rank}").read_text().split("\n")
        assert not [t for t in threads if "gloo" in t], (rank, threads)
