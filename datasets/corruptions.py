"""CIFAR-10-C corruptions for any image size, in numpy / scipy.ndimage / Pillow.

``corrupt(images, name, severity, seed)`` applies one of the 15 corruptions of CIFAR-10-C
(Hendrycks & Dietterich, ICLR 2019) or one of its 4 extras to a batch of uint8 images
``[N, H, W]`` (grayscale) or ``[N, H, W, C]`` (C = 1 or 3) and returns a uint8 array of the
same shape.  The severity constants are those of ``make_cifar_c.py`` (repository
hendrycks/robustness, ``ImageNet-C/create_c/make_cifar_c.py``, Apache-2.0), recorded in the
tables below; the code is our own (no OpenCV, Wand, scikit-image or ``imagecorruptions``).

Randomness.  Every call draws from one ``numpy.random.Generator``,
``bench.data.corruption_rng(name, severity, seed)`` (never the global RNG), so a call is a
pure function of its arguments.  Draws follow the batch order (in chunks of
``CHUNK_ELEMENTS`` values, a fixed function of the image size), so an image's corruption
depends on its position in the batch: corrupt a whole split as one array.  This module
is the pure engine (arrays in, arrays out); ``datasets.corruption_cache`` stores each
(images, corruption, severity, seed) result on disk once, under the engine ``VERSION``,
and ``datasets.shift`` gives every image data family its
``shift/<corruption>/<severity>`` splits.  The corruption names and severities are defined once, in ``bench.data``.

Speed.  Everything is vectorised over the batch (one sparse linear map for zoom blur, one
gather per kernel tap for motion blur, interleaved swap classes for glass blur, Poisson
quantile tables for shot noise); only ``pixelate`` and ``jpeg_compression`` loop over
images, through Pillow.  ``benchmarks/corruption_cost.py`` times the 75 benchmark splits.

Image size.  The CIFAR constants are for 32x32.  With ``s = min(H, W) / 32``, lengths in
pixels are multiplied by ``s`` so the effect covers the same fraction of the image:
Gaussian-blur, glass-blur and spatter sigmas, defocus radius and its anti-alias sigma,
motion-blur radius and sigma, glass-blur shift (at least 1 px), snow flake zoom and streak
length, the frost texture's crystal size, and the spatter drop size and edge distance.
Elastic transform uses the original's own parametrisation by image size
(``IMSIZE = min(H, W)``).  Zoom factors, pixelate factors and the fog fractal (a plasma map of
the next power of two >= max(H, W), cropped) are relative already; noise, brightness,
contrast, saturate and JPEG quality are per-pixel and unscaled.  At the smallest sizes the
mildest blurs can round to the identity (e.g. Gaussian blur severity 1 at 8x8 has sigma 0.1
px), as a 0.4 px blur at 32x32 does to an image downsampled to 8x8.

Grayscale.  Colour-dependent corruptions (``saturate``, ``frost``, ``spatter``) convert a
one-channel image to three equal channels, corrupt, and return the channel mean.  The other
corruptions act on one channel directly, which gives the same result as that round trip:
``brightness`` (V of HSV is the grey value), ``snow`` (its grey conversion is the identity on
one channel), ``fog`` and all others (per-channel or channel-independent).  A grey image has
no saturation, so ``saturate`` severities 1-3 (which only scale saturation) leave it unchanged.

Deviations from CIFAR-10-C (the reference imports OpenCV, Wand/ImageMagick and skimage):

* output is rounded to uint8 (the reference truncates with ``np.uint8``);
* ``shot_noise`` samples Poisson counts by inverse CDF from a 2**14-entry quantile table per
  grey level (probability masses exact to 1/2**14); ``numpy``'s Poisson sampler is 10x slower;
* ``glass_blur`` swaps every pixel with a random neighbour as the reference does, but in
  (2d)^2 interleaved classes of non-overlapping swaps (vectorised) instead of one raster sweep;
* ``motion_blur`` (and the snow streaks) use ImageMagick's one-sided Gaussian line kernel
  (width ``2 ceil(radius) + 1``, offsets ``ceil(i cos a - 0.5), ceil(i sin a - 0.5)``), with
  taps below 1e-3 of the first dropped;
* ``frost`` blends a procedural texture (seeded crystal needles with side branches over a
  plasma-fractal haze, pale blue) instead of the six frost photographs, which are not ours to
  ship; a fixed bank of 5 textures (the reference draws from its first 5 photos) is cropped at
  random, as the reference crops its 0.2x resized photos;
* ``spatter`` (water, severities 1-3) takes the Canny edges of the liquid layer to be the
  boundary of the thresholded liquid mask (the layer jumps from 0 to >= 0.68 there; weaker
  gradient edges inside drops are not traced) and the exact Euclidean distance instead of
  OpenCV's 5x5 mask approximation;
* ``elastic_transform`` uses bilinear interpolation with float weights for the affine step
  (OpenCV quantises the weights to 1/32).
"""
from __future__ import annotations

import difflib
import functools
import io
import math
from typing import Callable

import numpy as np
import scipy.ndimage as ndi
import scipy.sparse as sp
import scipy.special
from PIL import Image

from bench.data import CORRUPTIONS, check_severity, corruption_rng

VERSION = 1  # bump on any change that alters outputs: it is part of every cache path

MIN_SIDE = 8
CHUNK_ELEMENTS = 1 << 21  # values (N*H*W*3) per chunk: keeps temporaries cache-friendly

# --------------------------------------------------------------------------------------
# Severity constants, one row per severity 1..5.  Source: hendrycks/robustness,
# ImageNet-C/create_c/make_cifar_c.py (Apache-2.0), the CIFAR-10-C generator.
# --------------------------------------------------------------------------------------
GAUSSIAN_NOISE = (0.04, 0.06, 0.08, 0.09, 0.10)  # std of additive noise, [0,1] scale
SHOT_NOISE = (500, 250, 100, 75, 50)  # photons at full scale: Poisson(x c) / c
IMPULSE_NOISE = (0.01, 0.02, 0.03, 0.05, 0.07)  # salt-and-pepper amount (per value)
SPECKLE_NOISE = (0.06, 0.10, 0.12, 0.16, 0.20)  # std of multiplicative noise
GAUSSIAN_BLUR = (0.4, 0.6, 0.7, 0.8, 1.0)  # sigma, px
GLASS_BLUR = ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2))  # sigma, max shift, iterations
DEFOCUS_BLUR = ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1))  # disk radius, anti-alias sigma
MOTION_BLUR = ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5))  # ImageMagick radius, sigma; angle U(-45, 45)
# np.arange(1, stop, 0.01) as in the reference; float rounding makes the first 7 long (1.00..1.06)
ZOOM_BLUR = tuple(tuple(float(z) for z in np.arange(1, stop, 0.01)) for stop in (1.06, 1.11, 1.16, 1.21, 1.26))
SNOW = (  # mean, std, zoom, threshold, motion radius, motion sigma, blend; angle U(-135, -45)
    (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
    (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
    (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
    (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
    (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
)
FROST = ((1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45))  # image weight, frost weight
FOG = ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75))  # fog weight, plasma wibble decay
BRIGHTNESS = (0.05, 0.1, 0.15, 0.2, 0.3)  # added to V of HSV
CONTRAST = (0.75, 0.5, 0.4, 0.3, 0.15)  # factor about the per-channel mean
ELASTIC = (  # alpha, sigma, affine shift, all times IMSIZE (the reference's IMSIZE = 32)
    (0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05), (0.1, 0.03, 0.03),
)
PIXELATE = (0.95, 0.9, 0.85, 0.75, 0.65)  # BOX down to int(side * c), BOX back up
JPEG_QUALITY = (80, 65, 58, 50, 40)
SPATTER = (  # mean, std, sigma, threshold, intensity (water) / mud sigma, mode (0 water, 1 mud)
    (0.62, 0.1, 0.7, 0.7, 0.5, 0),
    (0.65, 0.1, 0.8, 0.7, 0.5, 0),
    (0.65, 0.3, 1, 0.69, 0.5, 0),
    (0.65, 0.1, 0.7, 0.69, 0.6, 1),
    (0.65, 0.1, 0.5, 0.68, 0.6, 1),
)
SATURATE = ((0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2))  # S of HSV -> S * a + b
# Colours from the reference (RGB): spatter water "pale turquoise", mud "brown".
WATER_RGB = (175 / 255, 238 / 255, 238 / 255)
MUD_RGB = (63 / 255, 42 / 255, 20 / 255)
GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # OpenCV RGB2GRAY, used by snow

# Ours (not from the reference): the procedural frost textures.
FROST_BANK_SEED = 0xF7057
FROST_BANK_SIZE = 5
FROST_TINT = (0.80, 0.90, 1.00)  # pale ice blue
POISSON_TABLE_BITS = 14


# ======================================================================================
# Public API
# ======================================================================================
def corrupt(images: np.ndarray, name: str, severity: int, seed: int = 0) -> np.ndarray:
    """Corrupt uint8 ``images`` ([N, H, W] or [N, H, W, C], C in {1, 3}, H, W >= 8) with
    corruption ``name`` at ``severity`` 1..5; returns a new uint8 array of the same shape.

    Deterministic: the same arguments give the same bytes.  See the module docstring for
    how parameters scale with image size and how grayscale images are treated."""
    check_name_severity(name, severity)
    rng = corruption_rng(name, severity, seed)
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8:
        raise ValueError(f"images must be a uint8 numpy array, got {getattr(images, 'dtype', type(images))}")
    if images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[3] not in (1, 3)):
        raise ValueError(f"images must be [N, H, W] or [N, H, W, C] with C in (1, 3), got shape {images.shape}")
    if min(images.shape[1:3]) < MIN_SIDE:
        raise ValueError(f"images must be at least {MIN_SIDE}x{MIN_SIDE}, got {images.shape[1]}x{images.shape[2]}")

    x = images[..., None] if images.ndim == 3 else images
    n, h, w, c = x.shape
    fn, needs_rgb = _CORRUPTIONS[name]
    scale = min(h, w) / 32.0
    out = np.empty_like(x)
    step = max(1, CHUNK_ELEMENTS // (h * w * 3))
    for start in range(0, n, step):
        chunk = x[start:start + step]
        if needs_rgb and c == 1:
            res = _to_float(fn(np.repeat(chunk, 3, axis=3), severity, rng, scale)).mean(axis=3, keepdims=True)
        else:
            res = fn(chunk, severity, rng, scale)
        out[start:start + step] = res if res.dtype == np.uint8 else _quantise(res)
    return out.reshape(images.shape)


def check_name_severity(name: str, severity: int) -> None:
    if name not in _CORRUPTIONS:
        close = difflib.get_close_matches(str(name), CORRUPTIONS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown corruption {name!r}{hint}; known: {', '.join(CORRUPTIONS)}")
    check_severity(severity)


def _to_float(u8: np.ndarray) -> np.ndarray:
    """uint8 -> float32 on [0, 1]; float input is returned unchanged."""
    return u8.astype(np.float32) * np.float32(1 / 255) if u8.dtype == np.uint8 else u8


def _quantise(x: np.ndarray) -> np.ndarray:
    """[0, 1] floats -> uint8, clipped and rounded to nearest."""
    y = np.multiply(x, np.float32(255), dtype=np.float32)
    np.clip(y, 0, 255, out=y)
    np.rint(y, out=y)
    return y.astype(np.uint8)


def _gauss(x: np.ndarray, sigma: float, mode: str, truncate: float = 4.0) -> np.ndarray:
    """Gaussian blur over the two image axes (1, 2) of a batch [n, H, W(, C)]."""
    sig = (0.0, sigma, sigma) + (0.0,) * (x.ndim - 3)
    return ndi.gaussian_filter(x, sig, mode=mode, truncate=truncate)


def _filter2d(x: np.ndarray, kernel: np.ndarray, mode: str) -> np.ndarray:
    """Correlate each image and channel of ``x`` [n, H, W, C] with an odd-sized 2-D kernel
    centred in its middle; as a sum of separable passes when that is cheaper."""
    u, sv, vt = np.linalg.svd(kernel)
    rank = int(np.sum(sv > sv[0] * 1e-7))
    if rank * sum(kernel.shape) < np.count_nonzero(kernel):
        out = None
        for r in range(rank):
            y = ndi.correlate1d(x, u[:, r] * sv[r], axis=1, mode=mode)
            y = ndi.correlate1d(y, vt[r], axis=2, mode=mode)
            out = y if out is None else out + y
        return out
    return ndi.correlate(x, kernel[None, :, :, None], mode=mode)


def _channel_extreme(x: np.ndarray, op: np.ufunc) -> np.ndarray:
    """Max or min (``op`` = np.maximum / np.minimum) over the channel axis of [n, H, W, C],
    kept as a length-1 axis (pairwise: numpy reduces short inner axes slowly)."""
    out = x[..., 0:1].copy()
    for ch in range(1, x.shape[3]):
        op(out, x[..., ch:ch + 1], out=out)
    return out


def _next_pow2(v: int) -> int:
    return 1 << max(1, (int(v) - 1).bit_length())


def _plasma(n: int, mapsize: int, decay: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` diamond-square plasma fractals [n, mapsize, mapsize] on [0, 1] (mapsize a power
    of two), the reference's ``plasma_fractal`` batched; toroidal, as the reference's."""
    m = mapsize
    a = np.zeros((n, m, m))
    step, wibble = m, 100.0

    def wibbled_mean(s: np.ndarray) -> np.ndarray:  # the reference's wibble * U(-wibble, wibble)
        return s / 4 + wibble * rng.uniform(-wibble, wibble, s.shape)

    while step >= 2:
        half = step // 2
        corner = a[:, 0:m:step, 0:m:step]
        sq = corner + np.roll(corner, -1, axis=1)
        sq = sq + np.roll(sq, -1, axis=2)
        a[:, half:m:step, half:m:step] = wibbled_mean(sq)
        dr = a[:, half:m:step, half:m:step]
        ul = a[:, 0:m:step, 0:m:step]
        a[:, 0:m:step, half:m:step] = wibbled_mean(dr + np.roll(dr, 1, axis=1) + ul + np.roll(ul, -1, axis=2))
        a[:, half:m:step, 0:m:step] = wibbled_mean(dr + np.roll(dr, 1, axis=2) + ul + np.roll(ul, -1, axis=1))
        step //= 2
        wibble /= decay
    a -= a.min(axis=(1, 2), keepdims=True)
    a /= np.maximum(a.max(axis=(1, 2), keepdims=True), 1e-12)
    return a.astype(np.float32)


def _zoom_matrix(h: int, z: float) -> np.ndarray:
    """[h, ceil(h/z)] linear map: the reference's ``clipped_zoom`` along one axis -- a
    length-``ceil(h/z)`` field (the centre crop when z >= 1) zoomed by ``z`` with
    ``scipy.ndimage.zoom(order=1)`` (output length ``round(ch z)``, corners aligned) and
    the central ``h`` samples kept."""
    ch = int(math.ceil(h / z))
    out_len = int(round(ch * z))
    trim = (out_len - h) // 2
    j = np.arange(trim, trim + h, dtype=np.float64)
    coord = j * (ch - 1) / (out_len - 1) if out_len > 1 else np.zeros(h)
    i0 = np.clip(np.floor(coord).astype(np.intp), 0, ch - 1)
    i1 = np.minimum(i0 + 1, ch - 1)
    f = coord - i0
    a = np.zeros((h, ch))
    np.add.at(a, (np.arange(h), i0), 1 - f)
    np.add.at(a, (np.arange(h), i1), f)
    return a


def _line_blur(x: np.ndarray, radius: float, sigma: float, angles_deg: np.ndarray) -> np.ndarray:
    """ImageMagick ``MotionBlurImage`` on a batch [n, H, W, C], one angle per image: a
    one-sided Gaussian line kernel, pixel (r, c) averaging (r + oy_i, c + ox_i) for taps
    i = 0..2 ceil(radius), ox_i = ceil(i cos a - 0.5), oy_i = ceil(i sin a - 0.5), with
    edge pixels repeated outside the image (ImageMagick's default virtual pixels).  One
    vectorised gather per tap from the edge-padded batch."""
    n, h, w, c = x.shape
    width = 2 * int(math.ceil(radius)) + 1
    taps = np.arange(width, dtype=np.float64)
    wts = np.exp(-taps**2 / (2 * sigma**2))
    keep = wts >= 1e-3 * wts[0]
    taps, wts = taps[keep], wts[keep] / wts[keep].sum()
    ang = np.deg2rad(np.asarray(angles_deg, dtype=np.float64))
    ox = np.ceil(taps[None, :] * np.cos(ang)[:, None] - 0.5).astype(np.int64)
    oy = np.ceil(taps[None, :] * np.sin(ang)[:, None] - 0.5).astype(np.int64)
    r = int(max(np.abs(ox).max(), np.abs(oy).max()))
    xp = np.pad(x, ((0, 0), (r, r), (r, r), (0, 0)), mode="edge")
    hp, wp = h + 2 * r, w + 2 * r
    flat = xp.reshape(n * hp * wp, c)
    grid = ((np.arange(h)[:, None] + r) * wp + np.arange(w)[None, :] + r).astype(np.int64)
    starts = np.arange(n, dtype=np.int64)[:, None] * (hp * wp) + oy * wp + ox  # [n, taps]
    out = np.zeros(x.shape, np.float32)
    for i in range(len(taps)):
        out += np.float32(wts[i]) * np.take(flat, starts[:, i, None, None] + grid, axis=0)
    return out


def _reflect_indices(n: int, pad: int, mode: str) -> np.ndarray:
    """Indices of a length-``n`` axis extended by ``pad`` on both sides by reflection:
    'mirror' is d c b | a b c d | c b a (OpenCV REFLECT_101), 'reflect' is c b a | a b c d | d c b."""
    i = np.arange(-pad, n + pad)
    if mode == "mirror":
        period = 2 * (n - 1)
        i = np.mod(i, period)
        return np.where(i >= n, period - i, i)
    period = 2 * n
    i = np.mod(i, period)
    return np.where(i >= n, period - 1 - i, i)


def _bilinear(img: np.ndarray, rows: np.ndarray, cols: np.ndarray, mode: str) -> np.ndarray:
    """Sample a batch [n, H, W, C] at float coordinates ``rows``, ``cols`` [n, H, W]; beyond
    the border the image is extended by reflection (see :func:`_reflect_indices`)."""
    n, h, w, c = img.shape
    over = max(0.0, -float(rows.min()), -float(cols.min()), float(rows.max()) - (h - 1), float(cols.max()) - (w - 1))
    pad = int(math.ceil(over)) + 1
    xp = np.take(np.take(img, _reflect_indices(h, pad, mode), axis=1), _reflect_indices(w, pad, mode), axis=2)
    hp, wp = h + 2 * pad, w + 2 * pad
    r = np.clip(rows + np.float32(pad), 0, hp - 2)
    q = np.clip(cols + np.float32(pad), 0, wp - 2)
    r0, q0 = np.floor(r), np.floor(q)
    fr = (r - r0).astype(np.float32)[..., None]
    fq = (q - q0).astype(np.float32)[..., None]
    idx = (np.arange(n, dtype=np.int64)[:, None, None] * hp + r0.astype(np.int64)) * wp + q0.astype(np.int64)
    flat = xp.reshape(n * hp * wp, c)
    top = np.take(flat, idx, axis=0)
    top += (np.take(flat, idx + 1, axis=0) - top) * fq
    bot = np.take(flat, idx + wp, axis=0)
    bot += (np.take(flat, idx + wp + 1, axis=0) - bot) * fq
    top += (bot - top) * fr
    return top


# ======================================================================================
# The corruptions.  Each takes a uint8 chunk [n, H, W, C], the severity, the generator and
# the size scale s = min(H, W) / 32, and returns floats on [0, 1] or uint8.
# ======================================================================================
def _gaussian_noise(u8, severity, rng, s):
    x = _to_float(u8)
    return x + rng.standard_normal(x.shape, dtype=np.float32) * np.float32(GAUSSIAN_NOISE[severity - 1])


@functools.lru_cache(maxsize=8)
def _poisson_quantiles(c: float) -> np.ndarray:
    """[256, 2**bits] uint16: row v holds Poisson(v/255 * c) quantiles at u = (j + 0.5) / 2**bits."""
    lam = np.arange(256) / 255.0 * c
    kmax = int(c + 12 * math.sqrt(c) + 30)
    cdf = scipy.special.pdtr(np.arange(kmax + 1)[None, :], lam[:, None])
    u = (np.arange(1 << POISSON_TABLE_BITS) + 0.5) / (1 << POISSON_TABLE_BITS)
    table = np.stack([np.searchsorted(row, u, side="left") for row in cdf])
    table = np.minimum(table, kmax).astype(np.uint16)
    table.flags.writeable = False
    return table


def _shot_noise(u8, severity, rng, s):
    c = SHOT_NOISE[severity - 1]
    table = _poisson_quantiles(float(c)).reshape(-1)
    idx = u8.astype(np.int32) << POISSON_TABLE_BITS
    idx |= rng.integers(0, 1 << POISSON_TABLE_BITS, size=u8.shape, dtype=np.uint16)
    return table[idx].astype(np.float32) * np.float32(1 / c)


def _impulse_noise(u8, severity, rng, s):
    amount = IMPULSE_NOISE[severity - 1]
    u = rng.random(u8.shape, dtype=np.float32)
    out = u8.copy()
    out[u < amount / 2] = 255  # salt and pepper equally likely, each value independently
    out[(u >= amount / 2) & (u < amount)] = 0
    return out


def _speckle_noise(u8, severity, rng, s):
    x = _to_float(u8)
    return x + x * rng.standard_normal(x.shape, dtype=np.float32) * np.float32(SPECKLE_NOISE[severity - 1])


def _gaussian_blur(u8, severity, rng, s):
    return _gauss(_to_float(u8), GAUSSIAN_BLUR[severity - 1] * s, mode="nearest")


def _glass_shuffle(u8: np.ndarray, d: int, iterations: int, rng: np.random.Generator) -> np.ndarray:
    """Swap each pixel (r, c), d < r, c <= side - d (the reference's sweep range), with
    (r + dy, c + dx), dy, dx ~ U{-d..d-1}; returns the shuffled copy.  Pixels 2d apart in
    both axes have disjoint swap partners, so each of the (2d)^2 interleaved classes is one
    vectorised swap (pixels packed into uint32 so a swap moves all channels)."""
    n, h, w, c = u8.shape
    packed = np.zeros((n, h, w, 4), np.uint8)
    packed[..., :c] = u8
    flat = packed.view(np.uint32).reshape(-1)
    m = 2 * d
    rows_all, cols_all = np.arange(h - d, d, -1), np.arange(w - d, d, -1)
    img = np.arange(n, dtype=np.int64)[:, None, None] * h
    for _ in range(iterations):
        for a in range(m):
            rows = rows_all[a::m]
            for b in range(m):
                cols = cols_all[b::m]
                if len(rows) == 0 or len(cols) == 0:
                    continue
                src = (img + rows[None, :, None]) * w + cols[None, None, :]
                off = rng.integers(-d, d, size=(2,) + src.shape, dtype=np.int64)
                dst = src + off[0] * w + off[1]
                moved = np.take(flat, src)
                flat[src] = np.take(flat, dst)
                flat[dst] = moved
    return packed[..., :c]


def _glass_blur(u8, severity, rng, s):
    sigma, delta, iterations = GLASS_BLUR[severity - 1]
    x = _quantise(_gauss(_to_float(u8), sigma * s, mode="nearest"))
    x = _glass_shuffle(x, max(1, int(round(delta * s))), iterations, rng)
    return _gauss(_to_float(x), sigma * s, mode="nearest")


@functools.lru_cache(maxsize=32)
def _defocus_kernel(radius: float, alias: float, half: int) -> np.ndarray:
    """The reference's ``disk``: an aliased disk of ``radius`` (normalised), smoothed by a
    (2 half + 1)-tap Gaussian of sigma ``alias`` (OpenCV's 3x3 at 32 px), trimmed to its
    support."""
    r_int = int(math.ceil(radius)) + half
    ax = np.arange(-r_int, r_int + 1)
    yy, xx = np.meshgrid(ax, ax, indexing="ij")
    disk = (xx**2 + yy**2 <= radius**2).astype(np.float64)
    disk /= disk.sum()
    t = np.arange(-half, half + 1, dtype=np.float64)
    g = np.exp(-t**2 / (2 * alias**2)) if alias > 0 else (t == 0).astype(np.float64)
    g /= g.sum()
    k = ndi.correlate1d(ndi.correlate1d(disk, g, axis=0, mode="constant"), g, axis=1, mode="constant")
    keep = np.abs(ax)[np.flatnonzero((k > 1e-7 * k.max()).any(axis=0))].max()
    k = k[r_int - keep:r_int + keep + 1, r_int - keep:r_int + keep + 1]
    k = k / k.sum()
    k.flags.writeable = False
    return k


def _defocus_blur(u8, severity, rng, s):
    radius, alias = DEFOCUS_BLUR[severity - 1]
    kernel = _defocus_kernel(radius * s, alias * s, max(1, int(round(s))))
    return _filter2d(_to_float(u8), kernel, mode="mirror")


def _motion_blur(u8, severity, rng, s):
    radius, sigma = MOTION_BLUR[severity - 1]
    angles = rng.uniform(-45, 45, size=len(u8))
    return _line_blur(_to_float(u8), radius * s, sigma * s, angles)


@functools.lru_cache(maxsize=16)
def _zoom_blur_operator(h: int, w: int, severity: int) -> sp.csr_array:
    """Sparse [H W, H W] map of a flattened image to its zoom blur: the mean of the image
    and its ``clipped_zoom`` at every factor, divided by 255 (applied to raw uint8 values)."""
    zooms = ZOOM_BLUR[severity - 1]
    total = sp.identity(h * w, format="csr")
    for z in zooms:
        a_h, a_w = np.zeros((h, h)), np.zeros((w, w))
        zh, zw = _zoom_matrix(h, z), _zoom_matrix(w, z)
        top_h, top_w = (h - zh.shape[1]) // 2, (w - zw.shape[1]) // 2
        a_h[:, top_h:top_h + zh.shape[1]] = zh
        a_w[:, top_w:top_w + zw.shape[1]] = zw
        total = total + sp.kron(sp.csr_array(a_h), sp.csr_array(a_w), format="csr")
    total = (total / ((len(zooms) + 1) * 255.0)).astype(np.float32)
    return sp.csr_array(total)


def _zoom_blur(u8, severity, rng, s):
    n, h, w, c = u8.shape
    op = _zoom_blur_operator(h, w, severity)
    cols = u8.transpose(1, 2, 0, 3).reshape(h * w, n * c).astype(np.float32)
    return (op @ cols).reshape(h, w, n, c).transpose(2, 0, 1, 3)


def _snow(u8, severity, rng, s):
    loc, std, zoom, threshold, mb_radius, mb_sigma, blend = SNOW[severity - 1]
    x = _to_float(u8)
    n, h, w, c = x.shape
    zh, zw = _zoom_matrix(h, zoom * s), _zoom_matrix(w, zoom * s)
    layer = rng.normal(loc, std, size=(n, zh.shape[1], zw.shape[1]))
    layer = (zh @ layer @ zw.T).astype(np.float32)
    layer[layer < threshold] = 0
    np.clip(layer, 0, 1, out=layer)
    angles = rng.uniform(-135, -45, size=n)
    layer = _line_blur(layer[..., None], mb_radius * s, mb_sigma * s, angles)
    gray = x @ np.asarray(GRAY_WEIGHTS, np.float32)[:, None] if c == 3 else x
    x = blend * x + (1 - blend) * np.maximum(x, gray * 1.5 + 0.5)
    return x + layer + layer[:, ::-1, ::-1]


@functools.lru_cache(maxsize=8)
def _frost_bank(h: int, w: int) -> np.ndarray:
    """FROST_BANK_SIZE procedural frost textures [k, 4H, 4W, 3] on [0, 1], fixed (seeded by
    FROST_BANK_SEED): crystal needles with side branches at +-60 degrees, denser where a
    plasma-fractal haze is thick, over that haze, tinted pale blue.  Lengths scale with s."""
    s = min(h, w) / 32.0
    th, tw = 4 * h, 4 * w
    rng = np.random.default_rng(FROST_BANK_SEED)
    bank = np.empty((FROST_BANK_SIZE, th, tw, 3), np.float32)
    for k in range(FROST_BANK_SIZE):
        haze = _plasma(1, _next_pow2(max(th, tw)), 2.0, rng)[0, :th, :tw]
        n_needles = int(round(0.03 * th * tw / s**2))
        cand = rng.random((4 * n_needles, 2)) * (th, tw)
        accept = rng.random(4 * n_needles) < haze[cand[:, 0].astype(int), cand[:, 1].astype(int)] ** 1.5
        y0, x0 = cand[accept][:n_needles].T
        length = rng.uniform(2, 9, len(y0)) * s
        theta = rng.uniform(0, np.pi, len(y0))
        # four side branches per needle, at +-60 degrees, shorter toward the tip
        t = rng.uniform(0.15, 0.85, (len(y0), 4))
        side = np.where(rng.random((len(y0), 4)) < 0.5, -1.0, 1.0)
        by0 = y0[:, None] + t * length[:, None] * np.sin(theta)[:, None]
        bx0 = x0[:, None] + t * length[:, None] * np.cos(theta)[:, None]
        btheta = theta[:, None] + side * np.pi / 3
        blen = (1 - t) * length[:, None] * rng.uniform(0.3, 0.7, t.shape)
        sy = np.concatenate([y0, by0.ravel()])
        sx = np.concatenate([x0, bx0.ravel()])
        st = np.concatenate([theta, btheta.ravel()])
        sl = np.concatenate([length, blen.ravel()])
        bright = rng.uniform(0.5, 1.0, len(sl))
        steps = np.arange(int(math.ceil(sl.max() / 0.5)) + 1) * 0.5
        on = steps[None, :] <= sl[:, None]
        py = np.mod(np.rint(sy[:, None] + steps * np.sin(st)[:, None]), th).astype(np.intp)
        px = np.mod(np.rint(sx[:, None] + steps * np.cos(st)[:, None]), tw).astype(np.intp)
        acc = np.bincount((py * tw + px)[on], weights=np.broadcast_to(bright[:, None], on.shape)[on] * 0.5,
                          minlength=th * tw).reshape(th, tw)
        acc = ndi.gaussian_filter(acc, 0.6 * s, mode="wrap")
        crystals = 1 - np.exp(-2.5 * acc)
        frost = np.clip(0.45 * haze + 0.75 * crystals, 0, 1)
        bank[k] = frost[..., None] * np.asarray(FROST_TINT, np.float32)
    bank.flags.writeable = False
    return bank


def _frost(u8, severity, rng, s):
    a, b = FROST[severity - 1]
    n, h, w, _ = u8.shape
    bank = _frost_bank(h, w)
    k = rng.integers(0, FROST_BANK_SIZE, size=n)
    oy = rng.integers(0, bank.shape[1] - h, size=n)
    ox = rng.integers(0, bank.shape[2] - w, size=n)
    rows = oy[:, None, None] + np.arange(h)[None, :, None]
    cols = ox[:, None, None] + np.arange(w)[None, None, :]
    frost = bank[k[:, None, None], rows, cols]
    return np.float32(a) * _to_float(u8) + np.float32(b) * frost


def _fog(u8, severity, rng, s):
    a, decay = FOG[severity - 1]
    x = _to_float(u8)
    n, h, w, _ = x.shape
    fog = _plasma(n, _next_pow2(max(h, w)), decay, rng)[:, :h, :w, None]
    peak = x.max(axis=(1, 2, 3), keepdims=True)
    return (x + np.float32(a) * fog) * (peak / (peak + np.float32(a)))


def _brightness(u8, severity, rng, s):
    """V of HSV + c with H, S kept: every channel scales by V'/V (black becomes grey V')."""
    x = _to_float(u8)
    v = _channel_extreme(x, np.maximum)
    v_new = np.minimum(v + np.float32(BRIGHTNESS[severity - 1]), 1)
    out = x * (v_new / np.maximum(v, np.float32(1e-6)))  # x = 0 where v = 0
    out += np.where(v == 0, v_new, 0)
    return out


def _contrast(u8, severity, rng, s):
    x = _to_float(u8)
    mean = x.mean(axis=(1, 2), keepdims=True)
    return (x - mean) * np.float32(CONTRAST[severity - 1]) + mean


def _saturate(u8, severity, rng, s):
    """S of HSV -> clip(S a + b) with H, V kept (as skimage's rgb2hsv / hsv2rgb round trip):
    each channel's distance below V scales by S'/S; a grey pixel (S = 0, hue 0 in skimage)
    becomes (V, V(1 - S'), V(1 - S'))."""
    a, b = SATURATE[severity - 1]
    x = _to_float(u8)
    v = _channel_extreme(x, np.maximum)
    sat = np.divide(v - _channel_extreme(x, np.minimum), v, out=np.zeros_like(v), where=v > 0)
    sat_new = np.clip(sat * np.float32(a) + np.float32(b), 0, 1)
    ratio = np.divide(sat_new, sat, out=np.zeros_like(sat), where=sat > 0)
    grey = v * (1 - sat_new * np.asarray([0, 1, 1], np.float32))
    return np.where(sat > 0, v - (v - x) * ratio, grey)


def _elastic_transform(u8, severity, rng, s):
    x = _to_float(u8)
    n, h, w, _ = x.shape
    imsize = min(h, w)
    alpha, sigma, shift = (v * imsize for v in ELASTIC[severity - 1])
    # random affine: three points around the centre moved by U(-shift, shift), (x, y) order
    cx, cy, sq = float(w // 2), float(h // 2), float(imsize // 3)
    pts1 = np.array([[cx + sq, cy + sq], [cx + sq, cy - sq], [cx - sq, cy - sq]])
    pts2 = pts1[None] + rng.uniform(-shift, shift, size=(n, 3, 2))
    # inverse map (destination -> source), as warpAffine applies: solve [pts2 | 1] M^T = pts1
    inv = np.linalg.solve(np.concatenate([pts2, np.ones((n, 3, 1))], axis=2), np.broadcast_to(pts1, (n, 3, 2)))
    inv = inv.astype(np.float32)
    yy, xx = np.meshgrid(np.arange(h, dtype=np.float32), np.arange(w, dtype=np.float32), indexing="ij")
    src_x = inv[:, 0, 0, None, None] * xx + inv[:, 1, 0, None, None] * yy + inv[:, 2, 0, None, None]
    src_y = inv[:, 0, 1, None, None] * xx + inv[:, 1, 1, None, None] * yy + inv[:, 2, 1, None, None]
    x = _bilinear(x, src_y, src_x, mode="mirror")  # OpenCV BORDER_REFLECT_101
    if alpha == 0:
        return x
    # elastic: smooth random displacement fields, sampled with scipy's 'reflect' border
    dx = _gauss(rng.uniform(-1, 1, size=(n, h, w)).astype(np.float32), sigma, mode="reflect", truncate=3) * alpha
    dy = _gauss(rng.uniform(-1, 1, size=(n, h, w)).astype(np.float32), sigma, mode="reflect", truncate=3) * alpha
    return _bilinear(x, yy + dy, xx + dx, mode="reflect")


def _pil_each(u8: np.ndarray, op: Callable[[Image.Image], Image.Image]) -> np.ndarray:
    out = np.empty_like(u8)
    for i, img in enumerate(u8):
        res = op(Image.fromarray(img if img.shape[2] == 3 else img[..., 0]))
        out[i] = np.asarray(res).reshape(img.shape)
    return out


def _pixelate(u8, severity, rng, s):
    c = PIXELATE[severity - 1]
    h, w = u8.shape[1:3]
    small = (max(1, int(w * c)), max(1, int(h * c)))
    box = Image.Resampling.BOX
    return _pil_each(u8, lambda im: im.resize(small, box).resize((w, h), box))


def _jpeg_compression(u8, severity, rng, s):
    quality = JPEG_QUALITY[severity - 1]

    def roundtrip(im: Image.Image) -> Image.Image:
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=quality)
        # Pillow's JPEG decoder on the bytes: what Image.open(buf) decodes, at half the cost
        return Image.frombytes(im.mode, im.size, buf.getvalue(), "jpeg", im.mode, "")

    return _pil_each(u8, roundtrip)


def _equalize_hist(u8: np.ndarray) -> np.ndarray:
    """OpenCV ``equalizeHist`` per image of a batch [n, H, W] uint8."""
    n = len(u8)
    hist = np.bincount((u8.reshape(n, -1).astype(np.intp) + 256 * np.arange(n)[:, None]).ravel(),
                       minlength=256 * n).reshape(n, 256)
    cdf = np.cumsum(hist, axis=1)
    total = cdf[:, -1:]
    first = np.take_along_axis(cdf, np.argmax(hist > 0, axis=1)[:, None], axis=1)
    span = total - first
    lut = np.rint(np.clip(cdf - first, 0, None) * 255.0 / np.maximum(span, 1))
    lut = np.where(span > 0, lut, np.arange(256)[None, :]).astype(np.uint8)  # constant image: unchanged
    return np.take_along_axis(lut, u8.reshape(n, -1).astype(np.intp), axis=1).reshape(u8.shape)


_IN_PLANE_CROSS = np.zeros((3, 3, 3), bool)
_IN_PLANE_CROSS[1] = [[0, 1, 0], [1, 1, 1], [0, 1, 0]]
_EMBOSS = np.array([[-2, -1, 0], [-1, 1, 1], [0, 1, 2]], np.float32)


def _spatter(u8, severity, rng, s):
    loc, std, sigma, threshold, intensity, mud = SPATTER[severity - 1]
    x = _to_float(u8)
    n = len(x)
    liquid = _gauss(rng.normal(loc, std, size=x.shape[:3]).astype(np.float32), sigma * s, mode="nearest")
    liquid[liquid < threshold] = 0
    if mud:
        m = _gauss((liquid > threshold).astype(np.float32), intensity * s, mode="nearest")
        m[m < 0.8] = 0
        m = m[..., None]
        return x * (1 - m) + np.asarray(MUD_RGB, np.float32) * m
    # water: tint drops pale turquoise, strongest far from the drop edges, embossed
    mask = liquid > 0
    edges = mask & ~ndi.binary_erosion(mask, structure=_IN_PLANE_CROSS, border_value=1)
    cap = 20.0 * s
    if edges.any():  # huge spacing between images: no distance crosses from one to another
        dist = np.minimum(ndi.distance_transform_edt(~edges, sampling=(1e6, 1, 1)), cap).astype(np.float32)
    else:
        dist = np.full(mask.shape, cap, np.float32)
    dist = ndi.uniform_filter(dist, size=(1, 3, 3), mode="mirror").astype(np.uint8)
    dist = _equalize_hist(dist).astype(np.float32)
    dist = np.clip(np.rint(ndi.correlate(dist, _EMBOSS[None], mode="mirror")), 0, 255)
    dist = ndi.uniform_filter(dist, size=(1, 3, 3), mode="mirror")
    m = liquid * dist
    peak = m.reshape(n, -1).max(axis=1)[:, None, None]
    m = np.divide(m, peak, out=np.zeros_like(m), where=peak > 0) * np.float32(intensity)
    return x + m[..., None] * np.asarray(WATER_RGB, np.float32)


#: The corruptions that act on colour: a one-channel image is corrupted as three equal
#: channels and the channel mean returned (module docstring, "Grayscale").
NEEDS_RGB = frozenset({"frost", "spatter", "saturate"})
# name -> (function, needs three channels), for every name of bench.data.CORRUPTIONS:
# corruption ``name`` is the function ``_<name>`` of this module (a name without one fails here, at import)
_CORRUPTIONS: dict[str, tuple[Callable, bool]] = {name: (globals()[f"_{name}"], name in NEEDS_RGB)
                                                  for name in CORRUPTIONS}
