"""Is speculative sampling lossless? At temperature > 0 the target's rejection sampling should leave the distribution
of what is generated exactly as without speculation (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", section 2.3 and appendix A.1). Greedy answers being equal says nothing about that, so this module samples one
fixed prompt many times (the API's ``n``) with and without speculation and tests the two token distributions with a
permutation G-test; the same test at the same sample size must also reject a known-different distribution (the
temperature x1.2), so its power is shown, not assumed, and two samples without speculation must not differ (its
false alarms). Positions after the first are tested: the first token comes from the target's prefill alone.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab

Sequences = Sequence[Sequence[str]]
ALPHA = 0.01  # a p-value at or below this rejects "the same distribution"
HOTTER = 1.2  # the known-different distribution: the same prompt at this multiple of the temperature
SAMPLE_NAMES = ("without speculation", "without speculation, again", "without speculation, hotter", "with speculation")


def sample_continuations(lab: Lab, prompt: str, n: int, max_tokens: int, temperature: float) -> list[tuple[str, ...]]:
    """``n`` sampled continuations of ``prompt`` (completions API, one request with ``n``), each its tokens."""
    response = lab.client.completions.create(model=lab.model, prompt=prompt, n=n, max_tokens=max_tokens,
                                             temperature=temperature, logprobs=0)
    return [tuple(c.logprobs.tokens) if c.logprobs and c.logprobs.tokens else (c.text,) for c in response.choices]


def lossless_sampler(lab: Lab, store: dict[str, list[tuple[str, ...]]], baseline: str, speculative: str, prompt: str,
                     n: int, max_tokens: int = 4, temperature: float = 1.0) -> Callable[[str], None]:
    """A ``run_methods(first_round=...)`` callback: on the ``baseline`` engine it samples at ``temperature`` twice
    and at ``HOTTER`` x it once, on the ``speculative`` one at ``temperature``; into ``store`` (``SAMPLE_NAMES``)."""
    def sample(name: str) -> None:
        draw = lambda t: sample_continuations(lab, prompt, n, max_tokens, t)  # noqa: E731
        if name == baseline:
            store[SAMPLE_NAMES[0]], store[SAMPLE_NAMES[1]] = draw(temperature), draw(temperature)
            store[SAMPLE_NAMES[2]] = draw(temperature * HOTTER)
        elif name == speculative:
            store[SAMPLE_NAMES[3]] = draw(temperature)
    return sample


def _categories(seqs: Sequences, skip: int) -> list[list[tuple[int, str]]]:
    return [[(i, token) for i, token in enumerate(s) if i >= skip] for s in seqs]


def g_statistic(counts_a: np.ndarray, counts_b: np.ndarray) -> np.ndarray:
    """The G statistic (2 x sum O ln(O/E)) of 2 x K tables, one per row of ``counts_a``/``counts_b``."""
    a, b = np.atleast_2d(counts_a).astype(float), np.atleast_2d(counts_b).astype(float)
    col, n_a, n_b = a + b, a.sum(axis=1, keepdims=True), b.sum(axis=1, keepdims=True)
    total = n_a + n_b
    g = np.zeros(a.shape[0])
    for obs, n in ((a, n_a), (b, n_b)):
        expected = col * n / total
        with np.errstate(divide="ignore", invalid="ignore"):
            g += 2 * np.where(obs > 0, obs * np.log(obs / expected), 0.0).sum(axis=1)
    return g


def permutation_test(seqs_a: Sequences, seqs_b: Sequences, skip_first: int = 1, permutations: int = 2000,
                     seed: int = 0) -> tuple[float, float]:
    """(G, p-value) for "A and B come from one distribution": the counts of (position, token) from position
    ``skip_first`` on, G against the same statistic with the sequences' labels shuffled (whole sequences move, so
    positions within one sequence may depend on each other)."""
    cats_a, cats_b = _categories(seqs_a, skip_first), _categories(seqs_b, skip_first)
    index = {c: i for i, c in enumerate(sorted({c for s in cats_a + cats_b for c in s}))}
    if not index:
        return 0.0, 1.0
    rows = np.zeros((len(cats_a) + len(cats_b), len(index)))
    for r, s in enumerate(cats_a + cats_b):
        for c in s:
            rows[r, index[c]] += 1
    labels = np.zeros(len(rows), dtype=bool)
    labels[:len(cats_a)] = True
    observed = float(g_statistic(rows[labels].sum(0), rows[~labels].sum(0))[0])
    rng = np.random.default_rng(seed)
    shuffled = np.array([rng.permutation(labels) for _ in range(permutations)], dtype=float)
    g = g_statistic(shuffled @ rows, (1 - shuffled) @ rows)
    return observed, float((1 + np.sum(g >= observed - 1e-9)) / (1 + permutations))


def _shift(seqs_a: Sequences, seqs_b: Sequences, skip_first: int = 1) -> str:
    """The (position, token) whose share moved most from A to B, in words."""
    count_a = Counter(c for s in _categories(seqs_a, skip_first) for c in s)
    count_b = Counter(c for s in _categories(seqs_b, skip_first) for c in s)
    pos, token = max(sorted(set(count_a) | set(count_b)), key=lambda c: abs(count_b[c] / len(seqs_b) - count_a[c] / len(seqs_a)))
    absent = sum(v for c, v in count_b.items() if c not in count_a)
    return (f"token {token!r} at position {pos + 1} in {count_a[(pos, token)]} of {len(seqs_a)} continuations without "
            f"speculation against {count_b[(pos, token)]} of {len(seqs_b)} with it; {absent} tokens sampled with "
            "speculation never appeared at their position without it")


def lossless_conclusion(p_same: float, p_hotter: float, p_again: float, n: int, alpha: float = ALPHA,
                        shift: str = "") -> Conclusion:
    """The verdict on "speculation leaves the sampled distribution unchanged": the test must first tell the
    ``HOTTER`` temperature apart (``p_hotter`` <= alpha, its power) and not two samples without speculation
    (``p_again`` > alpha); then ``p_same`` > alpha is shown, <= alpha not shown. ``n``: continuations per sample."""
    head = (f"{n} continuations each: with vs without speculation p = {p_same:.3g}; temperature x{HOTTER} vs x1 "
            f"p = {p_hotter:.3g}; two samples without speculation p = {p_again:.3g} (permutation G-test, reject at "
            f"p <= {alpha})")
    if p_hotter > alpha:
        return Conclusion(f"{head}: the test could not tell a x{HOTTER} temperature apart at this sample size, so it has "
                          "no power here and says nothing about speculation; raise LOSSLESS_SAMPLES or pick a prompt "
                          "whose next tokens are less certain.", WITHIN_NOISE)
    if p_again <= alpha:
        return Conclusion(f"{head}: two samples of the same engine already differed, so the test raises false alarms "
                          "here (a rare draw, or the engine's sampling changed between them); re-run.", WITHIN_NOISE)
    if p_same > alpha:
        return Conclusion(f"{head}: no difference found with speculation, while the same test at the same size told the "
                          f"x{HOTTER} temperature apart: rejection sampling kept the target's distribution.", SHOWN)
    return Conclusion(f"{head}: speculation changed the distribution ({shift or 'see the counts'}). Rejection sampling "
                      "as published is lossless, so this engine's speculative sampling path is not: greedy answers can "
                      "still match (the eval), but sampled ones do not come from the target alone.", NOT_SHOWN)


def lossless_tests(samples: dict[str, Sequences], permutations: int = 2000, alpha: float = ALPHA) -> Conclusion:
    """``lossless_conclusion`` on the four samples of ``lossless_sampler`` (``SAMPLE_NAMES``)."""
    if any(name not in samples for name in SAMPLE_NAMES):
        return Conclusion("the losslessness samples were not all taken (a method failed to start): not tested.",
                          WITHIN_NOISE)
    base, again, hotter, spec = (samples[name] for name in SAMPLE_NAMES)
    p = {name: permutation_test(base, other, permutations=permutations)[1]
         for name, other in (("same", spec), ("hotter", hotter), ("again", again))}
    return lossless_conclusion(p["same"], p["hotter"], p["again"], len(base), alpha, _shift(base, spec))


def entropy_bits(seqs: Sequences, position: int) -> float:
    """The entropy (bits) of the sampled token at ``position`` (0-based): 0 when every sample agrees."""
    counts = Counter(s[position] for s in seqs if len(s) > position)
    total = sum(counts.values())
    return -sum(v / total * math.log2(v / total) for v in counts.values()) if total else 0.0


def samples_summary(samples: dict[str, Sequences]) -> list[dict[str, Any]]:
    """One row per sample: its size and the entropy (bits) of each position (how uncertain the next token was)."""
    return [{"sample": name, "continuations": len(seqs),
             **{f"position {i + 1} bits": round(entropy_bits(seqs, i), 2) for i in range(max(map(len, seqs), default=0))}}
            for name, seqs in samples.items()]
