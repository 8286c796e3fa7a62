"""Build the data of the ``cifar10_subset`` suite from an official CIFAR-10 copy::

    .venv/bin/python -m datasets.cifar10_subset --from cifar-10-python.tar.gz DATA
    .venv/bin/python run_suite.py --suite cifar10_subset --data-root DATA

The subset is the first images of each official batch, as many as :data:`SUBSET` says:
1,102, 1,017, 1,017, 1,285 and 1,017 of ``data_batch_1`` .. ``data_batch_5`` (5,438
training images) and 1,017 of ``test_batch``.  These are the images of the copy that the
committed report ``reports/cifar10_subset/`` was run on (the leading images of each file
that survived in truncated public copies; ``docs/reference/data.md`` section 6), so a
complete official copy gives back exactly that data.

``--from`` is the official archive ``cifar-10-python.tar.gz`` (read in place, nothing
extracted), its extracted ``cifar-10-batches-py/`` folder, or a folder holding that one.
Each batch is read through the restricted unpickler (:mod:`datasets.safe_pickle`: numpy's
array globals only, as the CIFAR loader reads the files) and checked as the loader checks
it; a file whose md5 differs from the published one is named in a warning (the result is
then not the reference's subset).

``DATA/cifar-10-batches-py/`` gets ``data_batch_1`` .. ``data_batch_5`` and
``test_batch``, each the official dict (its keys in the source's order) with ``b"data"``,
``b"labels"`` and ``b"filenames"`` cut to the first images and ``b"batch_label"`` kept,
encoded as the official files are (:mod:`datasets.py2_pickle`), and ``batches.meta``
copied byte for byte.  The folder is written beside its final place and renamed into it,
so it appears whole or not at all; an existing one is never replaced.  Exit status: 0
written, 2 bad input (one line on stderr, nothing written).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Iterator, Mapping

from bench.core.errors import ConfigError, one_line
from datasets.formats import OFFICIAL_MD5, read_cifar_batch, read_cifar_meta
from datasets.py2_pickle import py2_dumps

FOLDER = "cifar-10-batches-py"
META = "batches.meta"
#: images kept from the start of each official batch, in file order
SUBSET: dict[str, int] = {"data_batch_1": 1102, "data_batch_2": 1017, "data_batch_3": 1017, "data_batch_4": 1285,
                          "data_batch_5": 1017, "test_batch": 1017}
#: the keys of a batch with one entry per image
PER_IMAGE = (b"data", b"labels", b"filenames")


def source_files(source: Path, names: tuple[str, ...]) -> Iterator[tuple[str, str, bytes]]:
    """``(name, label, bytes)`` of each file ``names`` of the official CIFAR-10 copy
    ``source``: an archive (a tar, compressed or not, holding ``cifar-10-batches-py/``; its
    regular members are read in archive order) or a folder that is, or holds,
    ``cifar-10-batches-py/``.  A file that is not there is a ConfigError naming it."""
    if source.is_dir():
        folder = source if (source / names[0]).is_file() else source / FOLDER
        for name in names:
            path = folder / name
            if not path.is_file():
                raise ConfigError(f"--from {source}: no {path}; give the official {FOLDER}/ folder, a folder "
                                  "holding it, or the archive cifar-10-python.tar.gz")
            yield name, str(path), path.read_bytes()
        return
    if not source.is_file():
        raise ConfigError(f"--from {source}: no such file or folder; give cifar-10-python.tar.gz or the "
                          f"extracted {FOLDER}/ folder")
    wanted = set(names)
    try:
        with tarfile.open(source, "r:*") as tar:
            for member in tar:
                head, _, name = member.name.rpartition("/")
                if member.isfile() and name in wanted and head.rpartition("/")[2] == FOLDER:
                    wanted.discard(name)
                    yield name, f"{source}:{member.name}", tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ConfigError(f"--from {source}: not a readable tar archive ({one_line(exc)}); give cifar-10-python.tar.gz "
                          f"or the extracted {FOLDER}/ folder") from None
    if wanted:
        raise ConfigError(f"--from {source}: the archive has no {FOLDER}/{', '.join(sorted(wanted))}; give the "
                          "official cifar-10-python.tar.gz")


def cut(batch: dict, n: int, label: str) -> dict:
    """``batch`` with its per-image entries cut to the first ``n`` images (other keys kept,
    in the batch's key order)."""
    have = len(batch[b"data"])
    if have < n:
        raise ConfigError(f"{label}: holds {have:,} images, the subset takes its first {n:,}; give a complete "
                          "official CIFAR-10 copy")
    if b"filenames" in batch and not isinstance(batch[b"filenames"], (list, tuple)):
        raise ConfigError(f"{label}: b'filenames' is of type {type(batch[b'filenames']).__name__}, not a list of names; give "
                          "the official CIFAR-10 files")
    if b"filenames" in batch and len(batch[b"filenames"]) != have:
        raise ConfigError(f"{label}: b'filenames' has {len(batch[b'filenames'])} entries for {have} images")
    return {key: value[:n] if key in PER_IMAGE else value for key, value in batch.items()}


def write_subset(source: Path | str, dest: Path | str, sizes: Mapping[str, int] = SUBSET) -> tuple[Path, list[str]]:
    """Write ``dest/cifar-10-batches-py/``: the first ``sizes[name]`` images of each batch of
    the official copy ``source`` and its ``batches.meta`` (module docstring).  Returns the
    folder written and the names of the files read whose md5 is not the published one."""
    source, dest = Path(source), Path(dest)
    final = dest / FOLDER
    if final.exists() or final.is_symlink():
        raise ConfigError(f"{final} already exists; the subset is written only where there is none (give another "
                          "destination, or remove it)")
    files: dict[str, bytes] = {}
    modified = []
    for name, label, raw in source_files(source, (*sizes, META)):
        if hashlib.md5(raw).hexdigest() != OFFICIAL_MD5[f"{FOLDER}/{name}"]:
            modified.append(name)
        if name == META:
            read_cifar_meta(label, "label_names", raw=raw)  # checked, then copied as it is
            files[name] = raw
        else:
            batch, _ = read_cifar_batch(label, "labels", raw=raw)
            files[name] = py2_dumps(cut(batch, sizes[name], label))
    dest.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=dest, prefix=f".{FOLDER}.", suffix=".part"))
    try:
        for name, data in files.items():
            (work / name).write_bytes(data)
        umask = os.umask(0)
        os.umask(umask)
        work.chmod(0o777 & ~umask)  # as mkdir would make it (mkdtemp makes it private)
        work.rename(final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return final, sorted(modified, key=[*sizes, META].index)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m datasets.cifar10_subset",
        description="Write the cifar10_subset data (the first images of each official CIFAR-10 batch: "
                    + ", ".join(f"{n:,} of {name}" for name, n in SUBSET.items())
                    + ") as DEST/cifar-10-batches-py/, for run_suite.py --suite cifar10_subset --data-root DEST.")
    p.add_argument("--from", dest="source", required=True, type=Path, metavar="PATH",
                   help="the official cifar-10-python.tar.gz, or its extracted cifar-10-batches-py/ folder (or a "
                        "folder holding it)")
    p.add_argument("dest", type=Path, metavar="DEST", help="the data root to write cifar-10-batches-py/ into")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        folder, modified = write_subset(args.source, args.dest)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the destination: a file in the way, no permission, a full disk
        print(f"error: the subset could not be written: {one_line(exc)}", file=sys.stderr)
        return 2
    if modified:
        print(f"warning: {', '.join(modified)} of {args.source} differ from the published files (md5): the subset "
              "is cut from them, so it is not the reference run's data", file=sys.stderr)
    train = sum(n for name, n in SUBSET.items() if name != "test_batch")
    print(f"wrote {folder}: {train:,} training and {SUBSET['test_batch']:,} test images; run the suite with "
          f"`.venv/bin/python run_suite.py --suite cifar10_subset --data-root {args.dest}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
