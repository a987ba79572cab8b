"""Speculative sampling's accept/reject rule (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", section 2.3; Chen et al. 2023): the target keeps a draft token x with probability min(1, p(x) / q(x)), and on
a rejection samples its own token from the normalised max(0, p - q). Every kept or resampled token then comes from the
target's distribution p exactly, whatever the draft's q. Pure numpy; notebook 06 writes the same rule out in a cell.
"""

from __future__ import annotations

import numpy as np


def _distribution(name: str, values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    if values.ndim != 1 or (values < 0).any() or not np.isclose(values.sum(), 1.0):
        raise ValueError(f"{name} must be a probability vector (non-negative, summing to 1), not {values}")
    return values


def accept_probability(p: np.ndarray, q: np.ndarray, x: int) -> float:
    """The chance the target keeps draft token ``x``: min(1, p(x) / q(x)) (the draft proposed x, so q(x) > 0)."""
    p, q = _distribution("p", p), _distribution("q", q)
    if q[x] <= 0:
        raise ValueError(f"the draft cannot have proposed token {x}: q({x}) = 0")
    return float(min(1.0, p[x] / q[x]))


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """What the target samples from after a rejection: max(0, p - q), normalised. When p == q nothing is ever rejected
    and the residual is empty; p itself is returned then."""
    p, q = _distribution("p", p), _distribution("q", q)
    left = np.maximum(0.0, p - q)
    return p.copy() if left.sum() <= 1e-12 else left / left.sum()


def verify_token(p: np.ndarray, q: np.ndarray, x: int, rng: np.random.Generator) -> tuple[int, bool]:
    """One verified position: (the token kept, whether it is the draft's). Draws one uniform u for the test and, on a
    rejection, one token from ``residual``, in that order."""
    keep = rng.random() < accept_probability(p, q, x)
    if keep:
        return int(x), True
    return int(rng.choice(len(p), p=residual(p, q))), False


def output_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The exact distribution of the token a verified position yields: q(x) min(1, p/q) + P(reject) residual(x),
    which is p (the rule is lossless)."""
    p, q = _distribution("p", p), _distribution("q", q)
    kept = np.minimum(p, q)
    return kept + (1 - kept.sum()) * residual(p, q)
