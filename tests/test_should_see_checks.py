"""The check that every should-see check of an executed notebook was decided on data (tests/should_see_checks.py),
on synthetic executed notebooks (nbformat): each way a check can fall short, and each way it may not be counted."""

from __future__ import annotations

import re

import nbformat
import pytest

import should_see_checks as checks
from helpers.core.lesson import NOT_SEEN, SEEN, UNDECIDED, Check
from helpers.lab.notebooks import NOTEBOOK_DIR, REPO_ROOT


def _printed(*lines: tuple[str, str, str]) -> str:
    """What should_see prints for each (claim, outcome, detail)."""
    return "".join(f"{Check(claim, outcome, detail)}\n" for claim, outcome, detail in lines)


def _cell(source: str, stdout: str = "") -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=stdout)] if stdout else []
    return cell


def _executed(tmp_path, *cells) -> object:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A lesson"), *cells])
    path = tmp_path / "99_executed.ipynb"
    nbformat.write(nb, path)
    return path


def test_checks_decided_on_data_or_within_noise_pass(tmp_path):
    path = _executed(tmp_path, _cell(
        'should_see("the prompt grows", grew, detail)\nshould_see_conclusion("TTFT grows", verdict)',
        _printed(("the prompt grows", SEEN, "from 10 to 40 tokens"),
                 ("TTFT grows", UNDECIDED, "the difference is not larger than the run-to-run spread (a noisy machine)"))))
    assert checks.problems(path) == []
    checks.assert_checks_decided(path)
    [first, second] = checks.printed_checks(nbformat.read(path, as_version=4))
    assert (first.cell, first.claim, first.outcome, first.detail) == (1, "the prompt grows", SEEN, "from 10 to 40 tokens")
    assert second.outcome == UNDECIDED and second.detail.startswith("the difference")


@pytest.mark.parametrize("outcome, detail, phrase", [
    (UNDECIDED, "batching: fewer than two concurrencies measured, no trend to read.", "fewer than two"),
    (UNDECIDED, "a: 0.5 vs b. The conditional acceptance needs k >= 2 with drafts at every position: not read here "
                "(largest k=1).", "needs k >= 2"),
    (NOT_SEEN, "only 1 model call was made: nothing to compare.", "nothing to compare"),
    (NOT_SEEN, "The streamed request gave too few tokens to time (1; error: None).", "too few"),
])
def test_a_check_that_lacked_data_fails_with_its_phrase_unless_allowed(tmp_path, outcome, detail, phrase):
    path = _executed(tmp_path, _cell('should_see_conclusion("the effect shows", verdict)',
                                     _printed(("the effect shows", outcome, detail))))
    [problem] = checks.problems(path)
    assert problem.startswith("cell 1: 'the effect shows' printed") and f"for lack of data ({phrase!r})" in problem
    with pytest.raises(AssertionError, match=re.escape("99_executed.ipynb: should-see checks not decided")):
        checks.assert_checks_decided(path)
    assert checks.problems(path, allow={"effect": "this path cannot measure it"}) == []


def test_a_seen_check_is_never_judged_by_its_words(tmp_path):
    path = _executed(tmp_path, _cell('should_see("one side only", True, d)',
                                     _printed(("one side only", SEEN, "too few to matter: nothing to compare"))))
    assert checks.problems(path) == []


def test_a_check_in_the_source_that_printed_nothing_fails(tmp_path):
    path = _executed(tmp_path,
                     _cell('should_see("a", x)\nshould_see("b", y)', _printed(("a", SEEN, ""))),
                     _cell("show_conclusions(conclude(runs));", "- a plain report line\n"),
                     _cell("show_conclusions(conclude(runs));", _printed(("c", SEEN, ""), ("d", NOT_SEEN, "slower"))))
    assert checks.problems(path) == [
        "cell 1: the source has 2 should_see / should_see_conclusion call(s) that always print one line; the run "
        "printed 1 check(s)",
        "cell 2: the source has 1 show_conclusions call(s) that always print at least one; the run printed 0 check(s)"]


@pytest.mark.parametrize("source, counted, why", [
    ('if ok:\n    should_see("a", x)\nelse:\n    should_see("a", None, "no config")', (1, 0), None),
    ('if ok:\n    should_see("a", x)', (0, 0), "in an if branch"),
    ('for f in findings:\n    should_see_conclusion(f.expectation, f)', (0, 0), "in a loop"),
    ('try:\n    should_see("a", x)\nexcept ValueError:\n    pass', (0, 0), "in a try statement"),
    ('def show():\n    should_see("a", x)', (0, 0), "in a definition"),
    ('c = should_see("a", x) if ok else None', (0, 0), "in a conditional expression"),
    ('ok and should_see("a", x)', (0, 0), "after `and`"),
    ('should_see("a", x, show=verbose)', (0, 0), "with show= not a constant"),
    ('should_see("a", x, show=False)\nlesson.should_see("b", y)', (1, 0), None),
    ('with quiet():\n    show_conclusions(found)\n    should_see("a", x);', (1, 1), None),
    ('print([should_see(c, v) for c, v in pairs])', (0, 0), "in a comprehension"),
    ("%%time\nshould_see('a', x)", (0, 0), None),  # a cell magic: not Python, nothing counted
])
def test_what_the_source_count_includes_and_what_it_names_as_uncounted(source, counted, why):
    ones, shows, uncounted = checks.source_checks(source, cell=7)
    assert (ones, shows) == counted
    assert [u.why for u in uncounted] == ([why] if why else [])
    if why:
        assert str(uncounted[0]).startswith("cell 7 line ") and why in str(uncounted[0])


def test_a_branch_that_printed_nothing_is_no_failure(tmp_path):
    path = _executed(tmp_path, _cell('if RUN_GO_DEEPER:\n    should_see("a", x)\nelse:\n    print("skipped")',
                                     "skipped\n"))
    assert checks.problems(path) == []


def test_every_phrase_is_one_a_lesson_prints():
    """Each LACK_OF_DATA phrase is in the helpers' or the notebooks' source: a phrase no lesson prints any more is
    dropped from the list, not kept matching nothing."""
    sources = [p.read_text() for p in (REPO_ROOT / "helpers").rglob("*.py")]
    sources += [c.source for p in NOTEBOOK_DIR.glob("*.ipynb") for c in nbformat.read(p, as_version=4).cells]
    text = "\n".join(sources).lower()
    assert [phrase for phrase in checks.LACK_OF_DATA if phrase.lower() not in text] == []


def test_every_workshop_notebook_has_checks_the_count_can_decide():
    """The count on the real notebooks' source: each lesson has checks that always print, and the ones in a branch
    or a loop are named (printed with -s: the checks not counted)."""
    for path in sorted(NOTEBOOK_DIR.glob("0[1-8]_*.ipynb")):
        ones, shows, uncounted = checks.notebook_source_checks(nbformat.read(path, as_version=4))
        assert ones + shows >= 1, f"{path.name}: no should-see check that always prints"
        print(f"{path.name}: {ones} checks and {shows} show_conclusions always print; not counted: "
              + ("; ".join(map(str, uncounted)) or "none"))


def test_the_local_paths_fixture_fails_after_a_run_whose_check_lacked_data(tmp_path, monkeypatch):
    """tests/notebook_local.py: ``run_local`` keeps the run, and the autouse fixture the test files import
    (``no_silent_long_cells``) fails after the test on a check that lacked data, unless the test allowed that claim."""
    import types

    import notebook_local

    def fake_run(source, out_dir, **kwargs):  # an executed notebook, as run_notebook leaves it
        cells = [_cell('should_see("the gain shows", v)', _printed(("the gain shows", UNDECIDED, kwargs["detail"])))]
        return types.SimpleNamespace(source=source, output=_executed(out_dir, *cells), silent_cells=[])

    monkeypatch.setattr(notebook_local, "run_notebook", fake_run)

    def after_one_run(detail, **allow):
        fixture = notebook_local.no_silent_long_cells.__wrapped__()
        next(fixture)
        notebook_local.run_local("99_x.ipynb", tmp_path, detail=detail, **allow)
        next(fixture, None)  # the teardown: raises when a check failed

    after_one_run("a +3% change inside the +/-8% spread")  # within noise: allowed
    with pytest.raises(AssertionError, match=r"99_x.ipynb cell 1: 'the gain shows' printed '~ cannot tell from this "
                                             r"run' for lack of data \('not measured at both'\)"):
        after_one_run("1.2x at concurrency 1 -> nanx at 4: not measured at both concurrencies.")
    after_one_run("not measured at both concurrencies.", allow_lack_of_data={"gain": "one concurrency on purpose"})
