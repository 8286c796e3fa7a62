"""Broken data files, found before the first cell: a damaged or hostile file of every
format is exit 2 with one message; an image whose header declares too many pixels is refused
before decoding, a tiny pickle cannot declare a huge array."""
from __future__ import annotations

import numpy as np
import pytest

from bench.run.cli import main


BREAKAGES = ["svhn text", "corruption npy shape", "corruption npy truncated", "corruption npy objects",
             "text named .png", "zero-byte .jpg", "empty OOD folder", "decompression bomb"]


def png_declaring(width: int, height: int) -> bytes:
    """A valid, tiny PNG whose header declares width x height 1-bit pixels."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


@pytest.mark.filterwarnings("ignore:.*differs from the official file's md5")  # fixture-sized copies
@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_broken_data_file_is_exit_2_before_the_first_cell(tmp_path, capsys, breakage):
    from tests.helpers.official_files import write_cifar10, write_cifar100, write_corruptions, write_image_folder, write_svhn

    root = tmp_path / "data"
    c10 = write_cifar10(root)
    write_cifar100(root)
    write_corruptions(root / "CIFAR-10-C", c10["x_test"], c10["y_test"])
    write_svhn(root / "svhn" / "test_32x32.mat")
    textures = root / "ood" / "textures"
    write_image_folder(textures)
    npy = root / "CIFAR-10-C" / "brightness.npy"
    if breakage == "svhn text":
        (root / "svhn" / "test_32x32.mat").write_text("this is not a MATLAB file\n")
    elif breakage == "corruption npy shape":
        np.save(npy, np.zeros((7, 32, 32, 3), np.uint8))
    elif breakage == "corruption npy truncated":
        npy.write_bytes(npy.read_bytes()[:200])
    elif breakage == "corruption npy objects":
        np.save(npy, np.array([{"x": 1}] * 5, dtype=object), allow_pickle=True)
    elif breakage == "text named .png":
        (textures / "a.png").write_text("not a PNG")
    elif breakage == "decompression bomb":
        (textures / "a.png").write_bytes(png_declaring(40000, 40000))  # 1.6e9 pixels in ~60 bytes
    elif breakage == "zero-byte .jpg":
        (textures / "b_sub" / "e.jpg").write_bytes(b"")
    else:
        import shutil

        shutil.rmtree(textures)
        textures.mkdir()
    code = main(["--suite", "cifar10", "--data-root", str(root), "--epochs", "1", "--seeds", "0",
                 "--methods", "msp", "--results", str(tmp_path / "results"),
                 "--reports", str(tmp_path / "reports"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    store = tmp_path / "results" / "cifar10"
    assert not store.exists() or not any(p.is_dir() for p in store.iterdir())  # no cell started
    assert not (tmp_path / "reports").exists()


def test_an_image_declaring_too_many_pixels_is_refused_before_decoding(tmp_path, monkeypatch):
    """A 5000 x 5000 PNG (under Pillow's own bomb limit) whose pixel data is missing: the
    refusal names the pixel count, so it came from the header, before any decoding (which
    would fail on the missing data).  UQBENCH_ALLOW_LARGE lets it be decoded."""
    from bench.core.errors import ConfigError
    from bench.config.options import ALLOW_LARGE_ENV
    from datasets.formats import read_image_folder

    monkeypatch.delenv(ALLOW_LARGE_ENV, raising=False)
    (tmp_path / "big.png").write_bytes(png_declaring(5000, 5000))
    with pytest.raises(ConfigError) as exc:
        read_image_folder(tmp_path, 32)
    assert "5000 x 5000 = 25,000,000 pixels, more than the 16,777,216 (4096 x 4096)" in str(exc.value), exc.value
    monkeypatch.setenv(ALLOW_LARGE_ENV, "1")
    with pytest.raises(ConfigError, match="cannot be read as an image"):  # decoded: the data are missing
        read_image_folder(tmp_path, 32)


def test_a_tiny_pickle_cannot_declare_a_huge_array():
    import pickle

    from datasets import safe_pickle

    # protocol 2: numpy.ndarray((1000000, 3072), 'B') through the allowed ndarray global
    payload = b"\x80\x02cnumpy\nndarray\nq\x00J@B\x0f\x00M\x00\x0c\x86q\x01X\x01\x00\x00\x00Bq\x02\x86q\x03Rq\x04."
    assert len(payload) < 100
    with pytest.raises(pickle.UnpicklingError, match="more than the file"):
        safe_pickle.load(payload)
    real = {b"data": np.arange(3 * 3072, dtype=np.uint8).reshape(3, 3072)}
    for protocol in (2, 4, 5):  # honest arrays of any protocol still load
        np.testing.assert_array_equal(safe_pickle.load(pickle.dumps(real, protocol=protocol))[b"data"], real[b"data"])
