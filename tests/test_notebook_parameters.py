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


# ---------------------------------------------------------------- values chosen by profile (issue 26)

def _parameters_source(path) -> str:
    from helpers.lab.notebooks import parameters_cell_index

    nb = nbformat.read(path, as_version=4)
    return nb.cells[parameters_cell_index(nb)].source


def test_a_by_profile_default_is_read_as_its_cpu_value():
    nb = _notebook("from helpers.lessons.l04_moe import by_profile\nREPEATS = by_profile(cpu=2, gpu=3)\n"
                   "SIZES = by_profile([1, 8], [1, 32])\nGPU = workshop_gpu()\n")
    assert notebook_parameters(nb) == {"REPEATS": 2, "SIZES": [1, 8], "GPU": NOT_A_LITERAL}
    assert check_parameters(["REPEATS=5"], {"a.ipynb": nb}) == {"a.ipynb": {"REPEATS": 5}}
    with pytest.raises(ParameterError, match="takes a whole number"):
        check_parameters(["REPEATS=many"], {"a.ipynb": nb})


@pytest.mark.parametrize("path", workshop_notebooks(), ids=lambda p: p.name)
def test_every_parameters_cell_chooses_by_profile_with_values_of_one_type(path):
    import ast

    tree = ast.parse(_parameters_source(path))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") in
             ("by_profile", "lesson_model", "lesson_models", "workshop_gpu")]
    assert calls, f"{path.name}: the parameters cell holds no value chosen by profile"
    for call in calls:
        if call.func.id != "by_profile":
            continue
        values = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        assert set(values) == {"cpu", "gpu"}, f"{path.name}: by_profile takes cpu= and gpu= ({ast.unparse(call)})"
        assert type(values["cpu"]) is type(values["gpu"]) or None in values.values(), ast.unparse(call)


@pytest.mark.parametrize("path", workshop_notebooks(), ids=lambda p: p.name)
def test_no_notebook_types_a_workshop_gpu_or_an_engine_model(path):
    """The workshop GPU comes from WORKSHOP_GPU (workshop_gpu()), the engine's models from the roles' table: a shipped
    tiny model is named in a parameters cell only for an exercise on its files."""
    import re

    from helpers.engine.interface import shipped_models

    source = _parameters_source(path)
    for line in source.splitlines():
        code = line.split("#")[0]
        if re.match(r"\s*(WORKSHOP_GPU|ROOFLINE_GPU)\s*=", code):
            assert "workshop_gpu()" in code, f"{path.name}: {line.strip()!r} types the workshop GPU"
        if any(f'"{m}"' in code for m in shipped_models()):
            assert code.startswith("EXERCISE_"), f"{path.name}: {line.strip()!r} types a shipped model"
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert 'switch_model("' not in text, f"{path.name} switches to a model typed in a cell"


@pytest.mark.parametrize("profile", ["gpu", "k8s"])
def test_on_a_gpu_every_parameters_cell_names_only_models_the_room_downloads(profile, monkeypatch, capsys):
    from helpers.core.models import ROOM_MODELS
    from helpers.engine.interface import shipped_models

    monkeypatch.setenv("WORKSHOP_PROFILE", profile)
    monkeypatch.setenv("VLLM_HOST", "http://vllm-engine:8000/v1")
    monkeypatch.setenv("NAMESPACE", "ws-01")
    monkeypatch.setenv("WORKSHOP_GPU", "L4")
    monkeypatch.delenv("WORKSHOP_EXTRA_MODELS", raising=False)
    for path in workshop_notebooks():
        values: dict = {}
        exec(compile(_parameters_source(path), path.name, "exec"), values)  # noqa: S102 - the shipped cell
        models = [v for name, v in values.items() if name in ("BASELINE", "DRAFT", "MISALIGNED_DRAFT", "TINY_DENSE",
                                                              "TINY_MOE")]
        models += values.get("VARIANTS", [])
        assert all(m is None or m in ROOM_MODELS for m in models), (path.name, models)
        assert not {m for m in models if m} & set(shipped_models())
        assert values.get("RUN_GO_DEEPER", False) is False
        for name in ("WORKSHOP_GPU", "ROOFLINE_GPU"):
            assert values.get(name, "L4") == "L4", (path.name, name)
    assert "WORKSHOP_GPU is unset" not in capsys.readouterr().out


def test_on_the_cpu_every_parameters_cell_names_shipped_models_and_runs_the_go_deeper_steps(monkeypatch):
    from helpers.engine.interface import shipped_models

    for name in ("WORKSHOP_PROFILE", "VLLM_HOST", "NAMESPACE", "WORKSHOP_GPU"):
        monkeypatch.delenv(name, raising=False)
    for path in workshop_notebooks():
        values: dict = {}
        exec(compile(_parameters_source(path), path.name, "exec"), values)  # noqa: S102 - the shipped cell
        models = [values[n] for n in ("BASELINE", "DRAFT", "MISALIGNED_DRAFT", "TINY_DENSE", "TINY_MOE") if n in values]
        assert set(models + values.get("VARIANTS", [])) <= set(shipped_models()), path.name
        assert values.get("RUN_GO_DEEPER", True) is True
