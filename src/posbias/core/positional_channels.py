"""Finding positional hidden channels (Yu et al. 2025, the prior-based positional hidden search; section numbers
are not quoted: the paper's text was not at hand, the rules below are the public code's): pure
numpy over hidden states averaged across random text, `mean[l, t, h]` = layer l's output at position t, channel h.

The public code (PositionalHidden, experiments/search_dimension/seach_dim_by_statistic.py) does, per channel:
1. monotonicity: in each layer 2..L-2, min-max normalise the channel's curve over positions 300.. (of 1000),
   fit a cubic (np.polyfit) and call the layer increasing / decreasing if the fitted curve's differences all
   are >= 0 / <= 0; the channel's monotone layers are the larger of the two sets (a tie: the decreasing);
2. keep channels monotone in more than L // 4 layers;
3. smoothness: in each of its monotone layers, normalise the curve over positions 200.., smooth it with a
   Savitzky-Golay filter (window 10, cubic), and sum the squared second differences; a channel's smoothness is
   the minimum over its monotone layers; the `top_k` smoothest (smallest) channels are the candidates.

Differences here: the skips are fractions of the sequence length (0.3 and 0.2: the paper's 300 and 200 of
1000 tokens), the fit runs in float64 (the public code fits float32), and the Savitzky-Golay filter is the same
least-squares window but evaluated only where the whole window fits (scipy's `interp` edge mode also fits
the first and last half-windows; scipy is not a dependency). The embedding output is always dropped (the public
code drops it only when the layer count is even, which is every model it was run on).
"""

from __future__ import annotations

import numpy as np

SAVGOL_WINDOW, SAVGOL_ORDER = 10, 3


def _normalise(y: np.ndarray) -> np.ndarray:
    """Min-max to [0, 1] per column; y (T, H). A constant column becomes NaN (never monotone, never smooth)."""
    lo, hi = y.min(axis=0), y.max(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (y - lo) / np.where(hi > lo, hi - lo, np.nan)


def monotone_direction(curves: np.ndarray, degree: int = 3) -> np.ndarray:
    """curves (T, H) -> (H,) int: +1 where the fitted degree-`degree` polynomial increases over all T, -1 where
    it decreases, 0 otherwise (step 1 above)."""
    y = _normalise(curves.astype(np.float64))  # (T, H)
    ok = np.isfinite(y).all(axis=0)  # (H,)
    x = np.arange(y.shape[0], dtype=np.float64)
    coef = np.polyfit(x, np.where(ok, y, 0.0), degree)  # (degree + 1, H)
    d = np.diff(np.vander(x, degree + 1) @ coef, axis=0)  # (T - 1, H)
    inc, dec = (d >= 0).all(axis=0) & ok, (d <= 0).all(axis=0) & ok
    return np.where(inc, 1, np.where(dec, -1, 0))


def savgol_valid(y: np.ndarray, window: int = SAVGOL_WINDOW, order: int = SAVGOL_ORDER) -> np.ndarray:
    """Savitzky-Golay smoothing along axis 0 where the whole window fits: y (T, H) -> (T - window + 1, H)."""
    t = np.arange(window, dtype=np.float64) - (window - 1) / 2
    coef = np.linalg.pinv(np.vander(t, order + 1, increasing=True))[0]  # (window,): the fit's value at the centre
    wins = np.lib.stride_tricks.sliding_window_view(y, window, axis=0)  # (T - window + 1, H, window)
    return wins @ coef


def roughness(curves: np.ndarray) -> np.ndarray:
    """curves (T, H) -> (H,): sum of squared second differences of the normalised, smoothed curve (step 3)."""
    y = savgol_valid(_normalise(curves.astype(np.float64)))
    r = np.square(np.diff(y, n=2, axis=0)).sum(axis=0)
    return np.where(np.isfinite(r), r, np.inf)


def find_candidates(mean: np.ndarray, top_k: int = 10, mono_skip: float = 0.3, smooth_skip: float = 0.2,
                    degree: int = 3) -> list[dict]:
    """mean (L, T, H): decoder layers' outputs (no embedding) averaged over random text -> up to top_k candidate
    channels, smoothest first: {"channel", "direction" (+1 increasing / -1 decreasing), "monotone_layers",
    "smoothness"}."""
    L, T, H = mean.shape
    m0, s0 = int(round(mono_skip * T)), int(round(smooth_skip * T))
    layers = list(range(2, L - 1))  # the public code's range(2, L - 1)
    direction = np.stack([monotone_direction(mean[i, m0:], degree) for i in layers])  # (L', H)
    rough = np.stack([roughness(mean[i, s0:]) for i in layers])  # (L', H)
    n_inc, n_dec = (direction > 0).sum(0), (direction < 0).sum(0)  # (H,)
    sign = np.where(n_inc > n_dec, 1, -1)  # the larger set; a tie goes to the decreasing one
    member = direction == sign[None, :]  # (L', H): the channel's monotone layers
    keep = np.flatnonzero(member.sum(0) > L // 4)
    smooth = np.where(member, rough, np.inf).min(axis=0)  # (H,)
    order = keep[np.argsort(smooth[keep], kind="stable")][:top_k]
    return [{"channel": int(c), "direction": int(sign[c]), "monotone_layers": [layers[i] for i in np.flatnonzero(member[:, c])],
             "smoothness": float(smooth[c])} for c in order]
