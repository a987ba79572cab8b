"""Is speculative sampling lossless? At temperature > 0 the target's rejection sampling should leave the distribution
of what is generated exactly as without speculation (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", section 2.3 and appendix A.1). Greedy answers being equal says nothing about that, so this module samples one
fixed prompt many times (the API's ``n``, seeded) with and without speculation and tests the two token distributions with a
permutation G-test; the same test at the same sample size must also reject a known-different distribution (the
temperature x1.2), so its power is shown, not assumed, and two samples without speculation must not differ (its
false alarms). Positions after the first are tested: the first token comes from the target's prefill alone, so
position 1 is a negative control that must not differ (with its own power check at x1.2).

A per-position test compares each position's token shares: it can reject, but passing it cannot show the joint
distribution of whole continuations unchanged. On vLLM's CPU build without Triton-CPU the stock engine's verified
tokens are sampled at a wrong temperature (vllm-project/vllm#55005); ``lossless_pair`` runs the same test on the stock
engine and on one with vllm-project/vllm#55006's fix (``helpers.engine.spec_sampling_fix``), side by side.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

import pandas as pd

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab

Sequences = Sequence[Sequence[str]]
ALPHA = 0.01  # a p-value at or below this rejects "the same distribution"
HOTTER = 1.2  # the known-different distribution: the same prompt at this multiple of the temperature
SAMPLE_NAMES = ("without speculation", "without speculation, again", "without speculation, hotter", "with speculation")
FIXED_SAMPLE = "with speculation, vllm#55006 applied"  # the same draws on the engine with the fix switched on
PERMUTATIONS = 2000
ISSUE = "https://github.com/vllm-project/vllm/issues/55005"
FIX = "https://github.com/vllm-project/vllm/pull/55006"


def sample_continuations(lab: Lab, prompt: str, n: int, max_tokens: int, temperature: float,
                         seed: int | None = None) -> list[tuple[str, ...]]:
    """``n`` sampled continuations of ``prompt`` (completions API, one request with ``n``), each its tokens; with
    ``seed``, vLLM seeds the i-th continuation ``seed + i``."""
    extra = {} if seed is None else {"seed": seed}
    response = lab.client.completions.create(model=lab.model, prompt=prompt, n=n, max_tokens=max_tokens,
                                             temperature=temperature, logprobs=0, **extra)
    return [tuple(c.logprobs.tokens) if c.logprobs and c.logprobs.tokens else (c.text,) for c in response.choices]


def lossless_sampler(lab: Lab, store: dict[str, list[tuple[str, ...]]], baseline: str, speculative: str, prompt: str,
                     n: int, max_tokens: int = 4, temperature: float = 1.0, fixed: str | None = None,
                     seed: int | None = None, counters: dict[str, dict[str, Any]] | None = None) -> Callable[[str], None]:
    """A ``run_methods(first_round=...)`` callback: on the ``baseline`` engine it samples at ``temperature`` twice
    and at ``HOTTER`` x it once, on the ``speculative`` one (and the ``fixed`` one) at ``temperature``; into ``store``
    (``SAMPLE_NAMES``, ``FIXED_SAMPLE``). ``seed``: each sample's draws seeded apart (the fixed and the stock engine
    get the same seeds). ``counters``: the server's spec-decode counters over each speculative sample, by its name."""
    def draw(t: float, index: int) -> list[tuple[str, ...]]:
        return sample_continuations(lab, prompt, n, max_tokens, t, None if seed is None else seed + index * n)

    def counted(name: str) -> None:
        from helpers.measure.server_metrics import scrape, window

        before = scrape(lab.settings.metrics_url) if counters is not None else None
        store[name] = draw(temperature, 3)
        if counters is not None:
            served = window(before, scrape(lab.settings.metrics_url))
            counters[name] = {"drafts": served["spec_decode_num_drafts"],
                              "accepted_tokens": served["spec_decode_num_accepted_tokens"],
                              "acceptance_rate": served["spec_decode_acceptance_rate"]}

    def sample(name: str) -> None:
        if name == baseline:
            store[SAMPLE_NAMES[0]], store[SAMPLE_NAMES[1]] = draw(temperature, 0), draw(temperature, 1)
            store[SAMPLE_NAMES[2]] = draw(temperature * HOTTER, 2)
        elif name == speculative:
            counted(SAMPLE_NAMES[3])
        elif fixed is not None and name == fixed:
            counted(FIXED_SAMPLE)
    return sample


def _categories(seqs: Sequences, skip: int, until: int | None = None) -> list[list[tuple[int, str]]]:
    return [[(i, token) for i, token in enumerate(s) if i >= skip and (until is None or i < until)] for s in seqs]


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


def permutation_test(seqs_a: Sequences, seqs_b: Sequences, skip_first: int = 1, permutations: int = PERMUTATIONS,
                     seed: int = 0, until: int | None = None) -> tuple[float, float]:
    """(G, p-value) for "A and B come from one distribution": the counts of (position, token) at positions
    ``skip_first`` up to ``until`` (0-based; None: to the end), G against the same statistic with the sequences'
    labels shuffled (whole sequences move, so positions within one sequence may depend on each other). The smallest
    p-value it can give is 1 / (permutations + 1)."""
    cats_a, cats_b = _categories(seqs_a, skip_first, until), _categories(seqs_b, skip_first, until)
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


def format_p(p: float, permutations: int = PERMUTATIONS) -> str:
    """A permutation p-value in words: at its floor 1 / (permutations + 1) it is a bound, "p <= 1/2001", not a value."""
    floor = 1 / (permutations + 1)
    return f"p <= 1/{permutations + 1}" if p <= floor * (1 + 1e-9) else f"p = {p:.3g}"


def _shift(seqs_a: Sequences, seqs_b: Sequences, skip_first: int = 1) -> str:
    """The (position, token) whose share moved most from A to B, in words."""
    count_a = Counter(c for s in _categories(seqs_a, skip_first) for c in s)
    count_b = Counter(c for s in _categories(seqs_b, skip_first) for c in s)
    if not count_a and not count_b:
        return "no tokens after the first"
    pos, token = max(sorted(set(count_a) | set(count_b)), key=lambda c: abs(count_b[c] / len(seqs_b) - count_a[c] / len(seqs_a)))
    absent = sum(v for c, v in count_b.items() if c not in count_a)
    return (f"token {token!r} at position {pos + 1} in {count_a[(pos, token)]} of {len(seqs_a)} continuations without "
            f"speculation against {count_b[(pos, token)]} of {len(seqs_b)} with it; {absent} tokens sampled with "
            "speculation never appeared at their position without it")


JOINT = ("a per-position test can reject, but passing it cannot show the joint distribution of whole continuations "
         "unchanged (it compares each position's token shares)")


def lossless_conclusion(p_same: float, p_hotter: float, p_again: float, n: int, alpha: float = ALPHA,
                        shift: str = "", permutations: int = PERMUTATIONS, p_first: float | None = None,
                        p_first_hotter: float | None = None) -> Conclusion:
    """The verdict on "speculation leaves the sampled distribution unchanged": the test must first tell the
    ``HOTTER`` temperature apart (``p_hotter`` <= alpha, its power) and not two samples without speculation
    (``p_again`` > alpha), and position 1, which the target samples alone, must not differ (``p_first`` > alpha; its
    own power ``p_first_hotter``); then ``p_same`` > alpha is shown, <= alpha not shown. ``n``: continuations per sample."""
    fp = lambda p: format_p(p, permutations)  # noqa: E731
    head = (f"{n} continuations each: with vs without speculation {fp(p_same)}; temperature x{HOTTER} vs x1 "
            f"{fp(p_hotter)}; two samples without speculation {fp(p_again)}")
    if p_first is not None:
        head += f"; position 1 (the control) with vs without {fp(p_first)}"
        if p_first_hotter is not None:
            head += f", x{HOTTER} vs x1 {fp(p_first_hotter)}"
    head += f" (permutation G-test, {permutations} permutations, reject at p <= {alpha})"
    if p_hotter > alpha:
        return Conclusion(f"{head}: the test could not tell a x{HOTTER} temperature apart at this sample size, so it has "
                          "no power here and says nothing about speculation; raise LOSSLESS_SAMPLES or pick a prompt "
                          "whose next tokens are less certain.", WITHIN_NOISE)
    if p_again <= alpha:
        return Conclusion(f"{head}: two samples of the same engine already differed, so the test raises false alarms "
                          "here (a rare draw, or the engine's sampling changed between them); re-run.", WITHIN_NOISE)
    if p_first is not None and p_first <= alpha:
        return Conclusion(f"{head}: position 1, which the target samples alone, differed too, so the two engines "
                          "differ in more than speculation (the prompt, the sampling settings) and this says nothing "
                          "about it; re-run.", WITHIN_NOISE)
    control = ""
    if p_first_hotter is not None and p_first_hotter > alpha:
        control = (f" (position 1's own check could not tell x{HOTTER} apart, so its not differing is weak evidence "
                   "that nothing else changed)")
    if p_same > alpha:
        return Conclusion(f"{head}: no difference found with speculation, while the same test at the same size told the "
                          f"x{HOTTER} temperature apart{control}: rejection sampling kept each position's distribution; "
                          f"{JOINT}.", SHOWN)
    return Conclusion(f"{head}: speculation changed the distribution of the verified tokens (positions 2 on) while "
                      f"position 1 did not differ{control}: they do not come from the target alone. An example, one that "
                      f"varies from run to run: {shift or 'see the counts'}.", NOT_SHOWN)


def lossless_tests(samples: dict[str, Sequences], permutations: int = PERMUTATIONS, alpha: float = ALPHA,
                   speculative: str = SAMPLE_NAMES[3]) -> Conclusion:
    """``lossless_conclusion`` on the samples of ``lossless_sampler`` (``SAMPLE_NAMES``; ``speculative``: which
    speculative sample, e.g. ``FIXED_SAMPLE``), position 1 tested as the control."""
    if any(name not in samples for name in (*SAMPLE_NAMES[:3], speculative)):
        return Conclusion("the losslessness samples were not all taken (a method failed to start): not tested.",
                          WITHIN_NOISE)
    return lossless_conclusion(**_p_values(samples, speculative, permutations), n=len(samples[SAMPLE_NAMES[0]]),
                               alpha=alpha, shift=_shift(samples[SAMPLE_NAMES[0]], samples[speculative]),
                               permutations=permutations)


def _p_values(samples: dict[str, Sequences], speculative: str, permutations: int) -> dict[str, float]:
    base, again, hotter, spec = (samples[name] for name in (*SAMPLE_NAMES[:3], speculative))
    test = lambda other, skip, until=None: permutation_test(base, other, skip, permutations, until=until)[1]  # noqa: E731
    return {"p_same": test(spec, 1), "p_hotter": test(hotter, 1), "p_again": test(again, 1),
            "p_first": test(spec, 0, 1), "p_first_hotter": test(hotter, 0, 1)}


def lossless_pair(samples: dict[str, Sequences], counters: dict[str, dict[str, Any]] | None = None,
                  permutations: int = PERMUTATIONS, alpha: float = ALPHA) -> tuple[list[Conclusion], pd.DataFrame]:
    """The same test on the stock engine and on the one with vllm#55006 (``FIXED_SAMPLE``), side by side: four
    conclusions, each with its expectation (the stock engine rejects, the fixed one does not, position 1 differs in
    neither, drafts are accepted in both: the server's ``counters`` over each sample), and one row per engine."""
    stock, fixed = SAMPLE_NAMES[3], FIXED_SAMPLE
    runs = {name: lossless_tests(samples, permutations, alpha, name) for name in (stock, fixed) if name in samples}
    p = {name: _p_values(samples, name, permutations) for name in runs if all(s in samples for s in SAMPLE_NAMES[:3])}
    counts = counters or {}
    rows = [{"engine": "stock" if name == stock else "vllm#55006 applied", "verdict": runs[name].verdict,
             "p, positions 2 on": format_p(p[name]["p_same"], permutations) if name in p else None,
             "p, position 1": format_p(p[name]["p_first"], permutations) if name in p else None,
             "drafts": counts.get(name, {}).get("drafts"), "acceptance_rate": counts.get(name, {}).get("acceptance_rate")}
            for name in runs]
    out = []
    found = runs.get(stock)
    bug = {NOT_SHOWN: SHOWN, SHOWN: NOT_SHOWN}.get(found.verdict, WITHIN_NOISE) if found else WITHIN_NOISE
    why = {SHOWN: " As vllm#55005 describes: on a CPU build without Triton-CPU the verified positions are sampled at a "
                  "temperature read from uninitialised memory.",
           NOT_SHOWN: " Expected on a GPU build or with Triton-CPU, where the stock engine is already right."}.get(bug, "")
    out.append(Conclusion(f"stock engine: {found.text}{why}" if found else "the stock engine was not sampled.", bug,
                          f"the stock engine's verified tokens differ at temperature > 0 ({ISSUE})"))
    if fixed in runs:
        out.append(Conclusion(f"with vllm#55006: {runs[fixed].text}", runs[fixed].verdict,
                              f"with the fix ({FIX}) the same test finds no difference"))
    else:
        out.append(Conclusion("the engine with vllm#55006 was not run (it is needed only on a CPU build without "
                              "Triton-CPU; on a GPU build the stock engine is already right).", WITHIN_NOISE,
                              f"with the fix ({FIX}) the same test finds no difference"))
    firsts = {name: v["p_first"] for name, v in p.items()}
    power = next(iter(p.values()))["p_first_hotter"] if p else None
    power_text = "" if power is None else (
        f"; its own power check, x{HOTTER} vs x1 at position 1, {format_p(power, permutations)}"
        + (" (told apart)" if power <= alpha else " (not told apart at this size: a weak control)"))
    out.append(Conclusion("position 1 with vs without speculation: " + ("; ".join(
        f"{'stock' if name == stock else 'fixed'} {format_p(v, permutations)}" for name, v in firsts.items())
        + power_text or "not tested"),
                          WITHIN_NOISE if not firsts else SHOWN if all(v > alpha for v in firsts.values()) else NOT_SHOWN,
                          "position 1, sampled by the target alone, does not differ in either run"))
    drafted = {name: counts.get(name, {}) for name in runs}
    accepted = [c.get("drafts") and c.get("accepted_tokens") for c in drafted.values()]
    out.append(Conclusion("drafts over the samples: " + ("; ".join(
        f"{'stock' if name == stock else 'fixed'} {c.get('drafts') or 0:.0f} drafts, {c.get('accepted_tokens') or 0:.0f} "
        f"draft tokens accepted ({(c.get('acceptance_rate') or 0):.1%})" for name, c in drafted.items()) or "none counted"),
        SHOWN if drafted and all(accepted) else NOT_SHOWN if drafted else WITHIN_NOISE,
        "drafts are accepted in both runs (the server's counters), so the fix left speculation on"))
    return out, pd.DataFrame(rows)


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
