"""Notebook 06's mechanism cells, the accept/reject rule of speculative sampling and E = (1 - a^(k+1)) / (1 - a),
against the helpers that take over from them (helpers/lessons/l06/sampling.py, helpers/planning/acceptance.py): each
tagged cell's source runs on its own in a fresh namespace (numpy only, no engine), and what it defines must agree
with the helper on two inputs, one of them an edge case (p == q; a = 0 and a = 1)."""

from __future__ import annotations

import numpy as np
import pytest

import notebook_cells
from helpers.lab.notebooks import NOTEBOOK_DIR
from helpers.lessons.l06 import sampling
from helpers.planning.acceptance import expected_accepted_length

NOTEBOOK = NOTEBOOK_DIR / "06_speculative_decoding.ipynb"


def mechanism_cells() -> list[str]:
    return [c.source for c in notebook_cells.tagged_cells(NOTEBOOK, "mechanism")]


def run_cell(defines: str, **names) -> dict:
    [source] = [s for s in mechanism_cells() if f"def {defines}(" in s]
    return notebook_cells.run_cells(source, **names)


def test_each_mechanism_cell_is_10_to_25_lines_and_imports_no_helper():
    cells = mechanism_cells()
    assert len(cells) == 2
    for source in cells:
        assert 10 <= len(source.splitlines()) <= 25, source
        assert "helpers" not in source  # the learner reads the rule itself, not a call


P, Q = np.array([0.5, 0.3, 0.15, 0.05]), np.array([0.2, 0.6, 0.1, 0.1])


@pytest.mark.parametrize("p, q", [(P, Q), (P, P.copy())], ids=["draft differs", "p == q (edge)"])
def test_the_accept_reject_cell_matches_the_helper(p, q, capsys):
    cell = run_cell("verify_token")
    for x in range(len(p)):
        assert cell["accept_probability"](p, q, x) == pytest.approx(sampling.accept_probability(p, q, x))
    np.testing.assert_allclose(cell["residual"](p, q), sampling.residual(p, q))
    # the same seed, the same draws: the cell and the helper keep or resample the same tokens
    mine, theirs = np.random.default_rng(7), np.random.default_rng(7)
    drafts = np.random.default_rng(1).choice(len(q), size=500, p=q)
    ours = [cell["verify_token"](p, q, int(x), mine) for x in drafts]
    helper = [sampling.verify_token(p, q, int(x), theirs) for x in drafts]
    assert [(int(t), bool(a)) for t, a in ours] == helper
    if np.array_equal(p, q):
        assert all(a for _, a in ours)  # p == q: every guess is kept
    else:
        assert not all(a for _, a in ours)
    # the cell's own run: the output shares are the target's p (the helper's exact distribution says so too)
    shares = np.bincount(cell["tokens"], minlength=4) / len(cell["tokens"])
    np.testing.assert_allclose(shares, cell["p"], atol=0.02)
    np.testing.assert_allclose(sampling.output_distribution(p, q), p)
    assert "output shares:" in capsys.readouterr().out


def test_the_helper_refuses_a_token_the_draft_could_not_propose():
    with pytest.raises(ValueError, match="cannot have proposed token 2"):
        sampling.accept_probability(P, np.array([0.5, 0.5, 0.0, 0.0]), 2)
    with pytest.raises(ValueError, match="probability vector"):
        sampling.residual(np.array([0.5, 0.6]), np.array([0.5, 0.5]))


@pytest.mark.parametrize("a, k", [(0.7, 3), (0.0, 3), (1.0, 3), (0.9, 1)],
                         ids=["a=0.7", "a=0 (edge: 1 token)", "a=1 (edge: the limit k+1)", "k=1"])
def test_the_tokens_per_step_cell_matches_the_helper(a, k, capsys):
    cell = run_cell("tokens_per_step", NUM_SPECULATIVE_TOKENS=k)
    assert cell["tokens_per_step"](a, k) == pytest.approx(expected_accepted_length(a, k))
    simulated = cell["simulated_tokens_per_step"](a, k, 20_000, np.random.default_rng(0))
    assert simulated == pytest.approx(expected_accepted_length(a, k), abs=0.05)
    if a in (0.0, 1.0):
        assert cell["tokens_per_step"](a, k) == (1.0 if a == 0 else k + 1)
    assert f"k = {k}: formula" in capsys.readouterr().out
