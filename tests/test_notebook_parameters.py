"""``workshop run -p NAME=VALUE``: names and values checked against the notebooks' parameters cells."""

from __future__ import annotations

import nbformat
import pytest

from helpers.lab.notebooks import (NOT_A_LITERAL, ParameterError, check_parameters, coerce_parameter, notebook_parameters,
                               parse_parameters, workshop_notebooks)


def _notebook(parameters_source: str | None) -> nbformat.NotebookNode:
    cells = [nbformat.v4.new_markdown_cell("# A lesson")]
    if parameters_source is not None:
        cells.append(nbformat.v4.new_code_cell(parameters_source, metadata={"tags": ["parameters"]}))
    cells.append(nbformat.v4.new_code_cell("print(N)"))
    return nbformat.v4.new_notebook(cells=cells)


LESSON_A = _notebook("# Parameters\nN = 3  # requests\nRATE: float = 0.5\nA, B = 1, 'x'\nSIZES = [1, 8]\n"
                     "PRICES = {'cpu': 0.1}\nBUDGET = 2 * 1024**3\nSTEP = 'fp8'\nQUICK = False\n")
LESSON_B = _notebook("N = 5\nREPEATS = 2\n")


def test_the_parameters_cell_is_read_with_its_defaults():
    params = notebook_parameters(LESSON_A)
    assert params == {"N": 3, "RATE": 0.5, "A": 1, "B": "x", "SIZES": [1, 8], "PRICES": {"cpu": 0.1},
                      "BUDGET": NOT_A_LITERAL, "STEP": "fp8", "QUICK": False}
    assert notebook_parameters(_notebook(None)) == {}


@pytest.mark.parametrize("default, text, value", [
    (16384, "1024", 1024),
    (0.9, "1", 1.0),
    (0.9, "0.5", 0.5),
    (False, "true", True),
    (True, "False", False),
    ("Qwen3-4B", "Qwen3-0.6B", "Qwen3-0.6B"),
    ("Qwen3-4B", "4", "4"),  # a string parameter takes the text as typed
    ("Qwen3-4B", '"quoted"', "quoted"),
    ("fp8_per_channel", "null", None),  # None leaves a step out (notebook 05, README)
    ("fp8_per_channel", "None", None),
    ([1, 8], "[1, 4, 16]", [1, 4, 16]),
    ([1, 8], "1,4", [1, 4]),
    (["L4"], "['H100 SXM']", ["H100 SXM"]),
    ({"cpu": 0.1}, '{"cpu": 0.2}', {"cpu": 0.2}),
    (NOT_A_LITERAL, "3", 3),
])
def test_a_value_takes_the_type_of_its_default(default, text, value):
    coerced = coerce_parameter(text, default)
    assert coerced == value and type(coerced) is type(value)


@pytest.mark.parametrize("default, text, message", [
    (16384, "abc", "takes a whole number"),
    (16384, "1024.5", "takes a whole number"),
    (16384, "true", "takes a whole number"),
    (0.9, "high", "takes a number"),
    (False, "1", "takes true or false"),
    ([1, 8], "8", "takes a list"),
    ([1, 8], '[1, "a"]', "takes a list of whole numbers"),
    ({"cpu": 0.1}, "3", "takes a dict"),
])
def test_a_value_of_another_type_is_refused(default, text, message):
    with pytest.raises(ValueError, match=message):
        coerce_parameter(text, default)


def test_every_shipped_default_is_taken_back_as_typed():
    for path in workshop_notebooks():
        params = notebook_parameters(nbformat.read(path, as_version=4))
        assert params, f"{path.name} has no parameters"
        for name, default in params.items():
            if default is not NOT_A_LITERAL:
                assert coerce_parameter(repr(default), default) == default, (path.name, name)


def test_a_parameter_goes_to_the_notebooks_that_have_it():
    out = check_parameters(["N=7", "REPEATS=1", "RATE=2"], {"a.ipynb": LESSON_A, "b.ipynb": LESSON_B})
    assert out == {"a.ipynb": {"N": 7, "RATE": 2.0}, "b.ipynb": {"N": 7, "REPEATS": 1}}
    assert check_parameters([], {"none.ipynb": _notebook(None)}) == {"none.ipynb": {}}


def test_a_name_no_notebook_has_is_refused_with_the_names_they_have():
    with pytest.raises(ParameterError) as err:
        check_parameters(["NO_SUCH=3"], {"a.ipynb": LESSON_A, "b.ipynb": LESSON_B})
    message = str(err.value)
    assert message.startswith("-p NO_SUCH=3: NO_SUCH is not a parameter of any of the 2 notebooks to run")
    assert "a.ipynb: N, RATE, A, B, SIZES" in message and "b.ipynb: N, REPEATS" in message
    with pytest.raises(ParameterError, match="not a parameter of b.ipynb; its parameters: N, REPEATS$"):
        check_parameters(["RATE=1"], {"b.ipynb": LESSON_B})


def test_a_name_in_the_wrong_case_or_misspelt_gets_a_suggestion():
    notebooks = {"a.ipynb": LESSON_A, "b.ipynb": LESSON_B}
    with pytest.raises(ParameterError, match=r"did you mean N \(in 2 of them\)\? Names are case-sensitive\.$"):
        check_parameters(["n=3"], notebooks)
    with pytest.raises(ParameterError, match=r"did you mean REPEATS \(b\.ipynb\)\?$"):
        check_parameters(["REPEAT=3"], notebooks)


def test_a_bad_value_names_the_notebook_the_type_and_the_default():
    with pytest.raises(ParameterError) as err:
        check_parameters(["REPEATS=abc"], {"a.ipynb": LESSON_A, "b.ipynb": LESSON_B})
    assert str(err.value) == "-p REPEATS=abc: REPEATS in b.ipynb takes a whole number (its default is 2), got 'abc'"


def test_a_pair_without_equals_is_refused():
    with pytest.raises(ParameterError, match="-p BADPARAM: a parameter must look like NAME=VALUE"):
        check_parameters(["BADPARAM"], {"a.ipynb": LESSON_A})


def test_python_literals_parse_as_the_docstring_says():
    assert parse_parameters(["n=3", "profile='cpu'", "label=quick"]) == {"n": 3, "profile": "cpu", "label": "quick"}
