"""Bezier curves that map layer depth to a RoPE scaling factor (LPES, Sec. 3.1).

A curve is given by its control points ``ctrl``, a float array of shape (d+1, 2)
whose rows are (x, y): x is a layer coordinate in [0, L-1], y a scaling factor.
The factor of layer h is read off the curve at the evenly spaced abscissa x_h
(eqs. 5-6); t(x) inverts the monotone x(t) by binary search (Appendix D).

Besides the Bezier curve, ``layer_factors`` offers the two alternatives of
Sec. 4.3.1 / Table 6: piecewise-linear interpolation through the control points,
and a step function through them.

Pure numpy; no torch, no transformers.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import PosbiasError

CURVES = ("bezier", "linear", "step")


def bernstein(d: int, k: int, t) -> np.ndarray:
    """Bernstein basis polynomial b_k^d(t) = C(d, k) t^k (1-t)^(d-k) (eq. 4), elementwise in t."""
    if not (isinstance(d, (int, np.integer)) and isinstance(k, (int, np.integer))) or d < 0 or not 0 <= k <= d:
        raise PosbiasError(f"bernstein needs integers 0 <= k <= d, got d={d!r}, k={k!r}", "pass a degree d >= 0 and 0 <= k <= d")
    t = np.asarray(t, dtype=float)
    return math.comb(int(d), int(k)) * t**k * (1.0 - t) ** (d - k)


def _basis(d: int, t: np.ndarray) -> np.ndarray:
    """All d+1 Bernstein polynomials at t: shape t.shape + (d+1,)."""
    return np.stack([bernstein(d, k, t) for k in range(d + 1)], axis=-1)


def _as_ctrl(ctrl, need_increasing: bool) -> np.ndarray:
    """Control points as a float (d+1, 2) array; optionally check x strictly increasing (eq. 10)."""
    c = np.asarray(ctrl, dtype=float)
    if c.ndim != 2 or c.shape[1] != 2 or c.shape[0] < 1:
        raise PosbiasError(f"control points must have shape (d+1, 2), got {c.shape}", "pass rows of (x, y)")
    if not np.all(np.isfinite(c)):
        raise PosbiasError("control points contain NaN or infinity", "pass finite (x, y) values")
    if need_increasing:
        if c.shape[0] < 2:
            raise PosbiasError("a layer curve needs at least 2 control points", "pass d+1 >= 2 rows of (x, y)")
        if not np.all(np.diff(c[:, 0]) > 0):
            raise PosbiasError(
                f"control-point x must be strictly increasing (eq. 10), got {c[:, 0].tolist()}",
                "sort the control points by x and make their x distinct",
            )
    return c


def bezier(ctrl, t) -> np.ndarray:
    """Points B(t) = sum_k b_k^d(t) P_k of the Bezier curve (eq. 3).

    ``t`` is a scalar or array in [0, 1]; the result has shape t.shape + (2,).
    """
    c = _as_ctrl(ctrl, need_increasing=False)
    t = np.asarray(t, dtype=float)
    if np.any(~np.isfinite(t)) or np.any(t < 0.0) or np.any(t > 1.0):
        raise PosbiasError("Bezier parameter t must lie in [0, 1] (eq. 3)", "clip t to [0, 1]")
    return _basis(c.shape[0] - 1, t) @ c


def t_of_x(ctrl, x, tol: float = 1e-12, max_iter: int = 200) -> np.ndarray:
    """Parameter t with x(t) = x, by bisection on [0, 1] (Appendix D), vectorised over ``x``.

    With strictly increasing control-point x, x'(t) = d * sum_k b_k^{d-1}(t) (x_{k+1} - x_k) > 0,
    so x(t) is strictly increasing and the inverse is unique. Bisection stops when every
    bracket is narrower than ``tol`` (in t) or after ``max_iter`` halvings. x = P_0^x and
    x = P_d^x map exactly to t = 0 and t = 1.
    """
    c = _as_ctrl(ctrl, need_increasing=True)
    if not tol > 0 or max_iter < 1:
        raise PosbiasError(f"t_of_x needs tol > 0 and max_iter >= 1, got {tol}, {max_iter}", "use the defaults")
    x = np.asarray(x, dtype=float)
    x0, xd = c[0, 0], c[-1, 0]
    slack = 1e-9 * max(1.0, xd - x0)
    if np.any(~np.isfinite(x)) or np.any(x < x0 - slack) or np.any(x > xd + slack):
        raise PosbiasError(f"x must lie in [{x0}, {xd}], the x range of the control points", "clip x to the curve's range")
    x = np.clip(x, x0, xd)
    d, cx = c.shape[0] - 1, c[:, 0]
    lo, hi = np.zeros_like(x), np.ones_like(x)
    for _ in range(max_iter):
        if np.all(hi - lo <= tol):
            break
        mid = 0.5 * (lo + hi)
        below = _basis(d, mid) @ cx < x
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    t = 0.5 * (lo + hi)
    return np.where(x == x0, 0.0, np.where(x == xd, 1.0, t))


def layer_abscissae(ctrl, n_layers: int) -> np.ndarray:
    """x_h = P_0^x + (P_d^x - P_0^x) / (L-1) * h for h = 0..L-1 (eq. 6).

    The last abscissa is set to P_d^x exactly (eq. 6 gives it up to rounding); with L = 1
    the single layer sits at P_0^x.
    """
    c = _as_ctrl(ctrl, need_increasing=True)
    if not isinstance(n_layers, (int, np.integer)) or n_layers < 1:
        raise PosbiasError(f"n_layers must be a positive integer, got {n_layers!r}", "pass the model's layer count")
    x0, xd = c[0, 0], c[-1, 0]
    if n_layers == 1:
        return np.array([x0])
    h = np.arange(n_layers, dtype=float)
    xs = x0 + (xd - x0) / (n_layers - 1) * h
    xs[-1] = xd
    return xs


def layer_factors(ctrl, n_layers: int, curve: str = "bezier") -> np.ndarray:
    """Per-layer scaling factors s_h, a float array of length L.

    * ``"bezier"``: s_h = proj_y B(t(x_h)) (eq. 5).
    * ``"linear"``: piecewise-linear interpolation through the control points at x_h (Table 6).
    * ``"step"``: s_h = y of the last control point with x <= x_h (Table 6); x_h within
      1e-9 (relative) of a control point counts as reaching it, so rounding in eq. 6 cannot
      move a layer across a step.
    """
    if curve not in CURVES:
        raise PosbiasError(f"unknown curve type {curve!r}", f"use one of {', '.join(CURVES)}")
    c = _as_ctrl(ctrl, need_increasing=True)
    xs = layer_abscissae(c, n_layers)
    cx, cy = c[:, 0], c[:, 1]
    if curve == "bezier":
        return bezier(c, t_of_x(c, xs))[:, 1]
    if curve == "linear":
        return np.interp(xs, cx, cy)
    slack = 1e-9 * max(1.0, cx[-1] - cx[0])
    idx = np.searchsorted(cx, xs + slack, side="right") - 1
    return cy[np.clip(idx, 0, len(cy) - 1)].astype(float)
