"""Executable theory (Wu et al., 2025, "On the Emergence of Position Bias in Transformers",
Sec. 3-4): seeded synthetic rollouts over attention masks, decay masks and RoPE, plus every
theorem check of `analysis.theorems` / `analysis.theorems_pe`, as plain-JSON numbers.

`compute_theory` returns the numbers; `run_theory` also draws the figures (with
`report.theory_plots`, from those same numbers, so a report can redraw them from the JSON)
and then writes ``theory.json``, atomically and last: its presence means a complete run.

Conventions follow `core.rollout`: tokens are 0-indexed, ``M[i, j]`` = query i attends to
key j, and depth index t means ``P^(t) = A^(t) ... A^(0)`` (t+1 layers). ``depth`` is the
number of layers, so t runs over 0 .. depth-1. Distance profiles read the LAST query row
i = N-1: ``profile[x] = P^(t)[N-1, N-1-x]`` for x = 0 .. N-1, so x = N-1 is the first token.

Sections of the result (all lists/dicts/floats):

* ``masks``: name, label and center nodes (Def. 3.1) of each mask;
* ``rollouts``: P^(t) for each mask at a few depths (rows sum to 1), for heatmaps;
* ``first_token``: min_i and mean_i of P^(t)[i, 0] for every t and mask (Thms 4.1-4.2);
* ``prefix``: prefix mass S_i^(t) = sum_{k<K} P^(t)[i, k] and per-prefix-token shares (Thm 4.3);
* ``decay`` / ``rope``: distance profiles with the predicted critical distance x* (Thm 4.5 /
  Thm 4.7); decay rows also carry the Theta shape C(t+x, x) e^{-xm} scaled to the profile, RoPE
  rows the envelope maximisers x_tight / x_loose of `check_rope`;
* ``checks``: `analysis.checks.check_all(seed, check_tokens, check_depth)` (``params.check_params``:
  what each check used); ``summary``: one short row per theorem.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..backends import open_model
from ..core.rollout import (
    causal_mask,
    center_nodes,
    full_mask,
    prefix_mask,
    random_attention_layers,
    sliding_window_mask,
)
from ..errors import PosbiasError
from ..models.load import DEFAULT_MODEL, Loaded
from ..runs import RunFolder
from .checks import check_all, check_kwargs, format_summary, summarize_checks
from .theorems import rollouts
from .theorems_pe import decay_critical_distance, log_binom, profile_argmax, rope_critical_distance
from .theorems_rope import fit_decay_constant, rope_cone_instance

THEORY_JSON = "theory.json"
HEAT_DEPTHS = (0, 2, 8)  # heatmap depths t, plus the final one
PROFILE_DEPTHS = (1, 4, 8)  # distance-profile depths t, plus the final one
ROPE_SCALE, ROPE_SPREAD = 5.0, 0.5  # `check_rope` defaults: |q||k| ~ 25, cone half-width 0.5 theta1


@dataclass(frozen=True)
class TheoryConfig:
    """Sizes and grids of the synthetic instances. ``depth`` = number of layers (t < depth).

    seed: seed of the random attention networks' inputs and weights.
    n_tokens: tokens N of each synthetic instance.
    depth: layers of the random attention networks.
    windows: sliding-window sizes compared (Thm 4.2).
    prefix_k: the prefix length of the prefix mask.
    decay_ms: decay-mask rates m compared (eq. 2).
    rope_fractions: RoPE angles: theta1 = f pi / (N - 1 + 3 spread), Lemma 4.6.
    d: the networks' hidden size.
    weight_norm: the norm of the random weight matrices.
    check_tokens: N of the theorem checks (None: each check's default; see checks.check_kwargs).
    check_depth: layers T of the theorem checks (None: each check's default).
    """

    seed: int = 0
    n_tokens: int = 64
    depth: int = 16
    windows: tuple[int, ...] = (4, 8, 16)
    prefix_k: int = 4
    decay_ms: tuple[float, ...] = (0.3, 0.6, 1.2)
    rope_fractions: tuple[float, ...] = (0.3, 0.6, 0.9)
    d: int = 8
    weight_norm: float = 1.0
    check_tokens: int | None = None
    check_depth: int | None = None

    def validate(self) -> "TheoryConfig":
        n = self.n_tokens
        if n < 4 or self.depth < 1:
            raise PosbiasError(f"need n_tokens >= 4 and depth >= 1, got {n} and {self.depth}",
                               "use `n_tokens=4` or more and `depth=1` or more")
        if any(not 2 <= w <= n for w in self.windows):
            raise PosbiasError(f"sliding window widths must be in [2, {n}], got {list(self.windows)}",
                               f"use widths from 2 to {n}")
        if not 1 <= self.prefix_k < n:
            raise PosbiasError(f"prefix_k must be in [1, {n - 1}], got {self.prefix_k}", f"use a prefix of 1 to {n - 1} tokens")
        if any(m <= 0 for m in self.decay_ms) or any(not 0 < f <= 1 for f in self.rope_fractions):
            raise PosbiasError(f"decay ms must be > 0 and RoPE fractions in (0, 1], got {list(self.decay_ms)} and "
                               f"{list(self.rope_fractions)}", "use e.g. decay_ms=(0.3, 0.6) and rope_fractions=(0.3, 0.9)")
        check_kwargs(self.check_tokens, self.check_depth)  # the checks' sizes: raises before anything is written
        return self


def pick_depths(candidates, depth: int) -> list[int]:
    """The candidate depths t < depth, plus the final t = depth-1, sorted and unique."""
    return sorted({t for t in candidates if t < depth} | {depth - 1})


# ---------------------------------------------------------------- masks: heatmaps, first-token mass


def mask_specs(cfg: TheoryConfig) -> list[tuple[str, str, torch.Tensor]]:
    """(name, label, mask) for no mask, causal, each sliding window and the prefix mask."""
    n, k = cfg.n_tokens, cfg.prefix_k
    specs = [("full", "no mask (full)", full_mask(n)), ("causal", "causal", causal_mask(n))]
    specs += [(f"window_{w}", f"sliding window w={w}", sliding_window_mask(n, w)) for w in sorted(set(cfg.windows))]
    return specs + [(f"prefix_{k}", f"prefix K={k}", prefix_mask(n, k))]


def mask_rollouts(cfg: TheoryConfig) -> dict[str, torch.Tensor]:
    """name -> P^(0..T-1), (T, N, N), on the same seeded random SAN (A1-A2) for every mask."""
    return {name: rollouts(random_attention_layers(cfg.n_tokens, cfg.depth, mask, cfg.d, cfg.weight_norm, cfg.seed))
            for name, _, mask in mask_specs(cfg)}


def first_token_section(ps_by_mask: dict[str, torch.Tensor]) -> dict:
    """min_i and mean_i of P^(t)[i, 0] for every t, per mask."""
    first = {name: ps[:, :, 0] for name, ps in ps_by_mask.items()}  # (T, N) each
    t = next(iter(first.values())).shape[0]
    return {"t": list(range(t)),
            "min": {k: v.min(dim=1).values.tolist() for k, v in first.items()},
            "mean": {k: v.mean(dim=1).tolist() for k, v in first.items()}}


def prefix_section(ps: torch.Tensor, k: int) -> dict:
    """Thm 4.3 on a prefix-mask rollout (T, N, N): prefix mass S_i^(t) (min, mean over i) and,
    per prefix token, mean_i P^(t)[i, k], min_i P^(t)[i, k] and mean_i P^(t)[i, k] / S_i^(t)."""
    pre = ps[:, :, :k]  # (T, N, K)
    mass = pre.sum(dim=-1)  # (T, N)
    return {"k": k, "mass_min": mass.min(dim=1).values.tolist(), "mass_mean": mass.mean(dim=1).tolist(),
            "token_mean": pre.mean(dim=1).tolist(), "token_min": pre.min(dim=1).values.tolist(),
            "share_mean": (pre / mass[:, :, None]).mean(dim=1).tolist()}


# ---------------------------------------------------------------- distance profiles (Thm 4.5, 4.7)


def last_row_profile(p: torch.Tensor) -> torch.Tensor:
    """profile[x] = P[N-1, N-1-x], x = 0..N-1 (x = N-1 is the first token). (N,)."""
    return p[-1].flip(0)


def scaled_shape(profile: torch.Tensor, log_shape: torch.Tensor) -> torch.Tensor:
    """exp(log_shape + b), with b the mean log-gap to the profile over x < N-1 (the first token,
    where the sink adds mass the Theta shape does not model, is left out of the fit). (N,)."""
    on = profile[:-1] > 0
    b = (profile[:-1][on].log() - log_shape[:-1][on]).mean()
    return (log_shape + b).exp()


def decay_section(cfg: TheoryConfig) -> list[dict]:
    """Thm 4.5: causal + decay mask (eq. 2), per m and depth t: profile, its argmax, x* = t/(e^m - 1)
    and the scaled shape C(t+x, x) e^{-xm}."""
    n, out = cfg.n_tokens, []
    x = torch.arange(n, dtype=torch.float64)
    for m in sorted(cfg.decay_ms):
        layers = random_attention_layers(n, cfg.depth, causal_mask(n), cfg.d, cfg.weight_norm, cfg.seed, decay_m=m)
        ps = rollouts(layers)
        for t in pick_depths(PROFILE_DEPTHS, cfg.depth):
            prof = last_row_profile(ps[t])
            pred = scaled_shape(prof, log_binom(t, x) - x * m)
            out.append(dict(m=m, t=t, x_star=decay_critical_distance(t, m), argmax=int(prof.argmax()),
                            profile=prof.tolist(), predicted=pred.tolist()))
    return out


def rope_theta(n: int, fraction: float) -> float:
    """theta1 = f pi / (N - 1 + 3 spread): Lemma 4.6's (delta + N - 1) theta1 <= pi (as `check_rope`)."""
    return fraction * math.pi / (n - 1 + 3 * ROPE_SPREAD)


def rope_section(cfg: TheoryConfig) -> list[dict]:
    """Thm 4.7: d = 2 causal RoPE instances (`rope_cone_instance`), per theta1 and depth t: profile,
    argmax, x* (App. H root with c fitted on the instance) and the exact maximisers of the two path
    envelopes of `check_rope`: x_tight (all distance in one hop, the paper's L(x)) and x_loose (equal
    hops). No scaled Theta shape here: the profiles are far flatter than e^{-c x^2 theta1^2} (the
    distance is spread over hops), so only the peak location is a meaningful prediction."""
    n, out = cfg.n_tokens, []
    x = torch.arange(n, dtype=torch.float64)
    for i, f in enumerate(sorted(cfg.rope_fractions)):
        th = rope_theta(n, f)
        inst = rope_cone_instance(n, cfg.depth, th, ROPE_SCALE, ROPE_SPREAD, cfg.seed + i)
        c = sum(fit_decay_constant(a, th) for a in inst.attns) / len(inst.attns)
        ps, kernel = rollouts(inst.attns), -c * (x * th) ** 2
        for t in pick_depths(PROFILE_DEPTHS, cfg.depth):
            prof = last_row_profile(ps[t])
            out.append(dict(theta1=th, fraction=f, c=c, t=t, x_star=rope_critical_distance(t, th, c),
                            x_tight=profile_argmax(t, kernel), x_loose=profile_argmax(t, kernel / (t + 1)),
                            argmax=int(prof.argmax()), profile=prof.tolist()))
    return out


# ---------------------------------------------------------------- the pipeline


def _plain(data: dict) -> dict:
    """Round-trip through JSON: plain types only, and no NaN/inf (raises ValueError)."""
    return json.loads(json.dumps(data, allow_nan=False))


def compute_theory(cfg: TheoryConfig) -> dict:
    """All the numbers of the theory run (no files). Deterministic for a config."""
    cfg.validate()
    ps_by_mask = mask_rollouts(cfg)
    heat = pick_depths(HEAT_DEPTHS, cfg.depth)
    checks = check_all(cfg.seed, cfg.check_tokens, cfg.check_depth)
    data = {
        "params": {**asdict(cfg), "heat_depths": heat, "profile_depths": pick_depths(PROFILE_DEPTHS, cfg.depth),
                   "rope_scale": ROPE_SCALE, "rope_spread": ROPE_SPREAD,
                   "check_params": {name: r["params"] for name, r in checks.items()}},
        "masks": [{"name": name, "label": label, "centers": center_nodes(m)} for name, label, m in mask_specs(cfg)],
        "rollouts": {"depths": heat, "P": {k: [ps[t].tolist() for t in heat] for k, ps in ps_by_mask.items()}},
        "first_token": first_token_section(ps_by_mask),
        "prefix": prefix_section(ps_by_mask[f"prefix_{cfg.prefix_k}"], cfg.prefix_k),
        "decay": decay_section(cfg),
        "rope": rope_section(cfg),
        "checks": checks,
        "summary": summarize_checks(checks),
    }
    return _plain(data)


@dataclass(frozen=True)
class RealRollout:
    """The same rollout on a real model's kv-lookup prompts (analysis/rollout_real.py).

    model: the real model: a registered name, a Hugging Face directory or hub id, or a .gguf file.
    facts: facts per kv-lookup prompt.
    n: kv-lookup examples per gold position.
    dtype: auto (bf16 where the device computes it natively, else fp32) | bf16 | fp32.
    device: cpu | cuda | auto (cuda if visible).
    """

    model: str = DEFAULT_MODEL
    facts: int = 10
    n: int = 8
    dtype: str = "auto"
    device: str = "cpu"

    def validate(self) -> "RealRollout":
        if self.n < 1 or self.facts < 2:
            raise PosbiasError(f"the real-model rollout needs `n` >= 1 examples and `facts` >= 2, got {self.n} and {self.facts}",
                               "use e.g. `n=8` and `facts=10`")
        return self

    def positions(self) -> list[int]:
        f = self.facts
        return [0, f // 4, f // 2, 3 * f // 4, f - 1]


@dataclass
class TheoryResult:
    """A theory run: `record` is theory.json; `rows` (the same as `summary`) has one flat dict per theorem: theorem,
    holds, failed (the names of its checks that failed), n, key (its numbers in one line); `format()` is what
    `posbias theory` prints."""

    summary: list[dict]  # one row per theorem: theorem, holds, failed checks, key numbers
    checks: dict  # every check's numbers
    figures: list[str]  # PNG names in the output folder
    real: dict | None  # the real-model rollout (real_rollout.json), when asked for
    record: dict = field(repr=False)  # the content of theory.json

    @property
    def rows(self) -> list[dict]:
        return self.summary

    def format(self) -> str:
        """One line per theorem (holds or which checks fail, its key numbers), then the real model's rollout: per
        residual and gold position, the first token's mass and the gold fact's share at the first and last layer."""
        from .rollout_real import format_real

        return "\n".join([format_summary(self.summary), *(format_real(self.real) if self.real else [])])


def run_theory(cfg: TheoryConfig | None = None, out: str | Path | None = None, *, real: RealRollout | None = None,
               loaded: Loaded | None = None) -> TheoryResult:
    """Compute the theory numbers; with `out`, draw the figures there, roll out the real model (if `real`)
    and write theory.json last. A rerun into the same folder recomputes everything (it takes seconds)."""
    cfg = (cfg or TheoryConfig()).validate()
    if real is not None:
        real.validate()
    from ..report.theory_plots import FIGURES
    from .rollout_real import FILES as REAL_FILES
    from .rollout_real import run_real_rollout

    folder = RunFolder(out, "theory run", THEORY_JSON, (*FIGURES, *REAL_FILES))
    fingerprint = {"config": asdict(cfg), "real": asdict(real) if real else None}
    with folder.open(fingerprint, resume=False, overwrite=True):
        data = compute_theory(cfg)
        data["figures"] = []
        if folder.path is not None:
            from ..report.theory_plots import plot_theory  # matplotlib only when drawing

            data["figures"] = plot_theory(data, folder.path)
        real_res = None
        if real is not None:
            lo = loaded or open_model(real.model, real.dtype, real.device, needs="the real-model rollout")
            real_res = run_real_rollout(lo, folder.path, facts=real.facts, n=real.n, seed=cfg.seed, positions=real.positions())
        folder.finish(data, indent=None, allow_nan=False)  # last: its presence means "complete"
    return TheoryResult(data["summary"], data["checks"], data["figures"], real_res, data)
