import datetime as dt

import pytest

from helpers.tiny import tools as T


def test_catalog_has_a_few_hundred_real_cities_with_time_zones():
    catalog = T.city_catalog()
    assert 300 <= len(catalog) <= 500
    assert catalog["Seoul"].timezone == "Asia/Seoul"


def test_weather_known_and_unknown_city():
    day = dt.date(2026, 3, 1)
    w = T.get_weather("Paris", today=day)
    assert w["city"] == "Paris" and -5 <= w["temperature_c"] <= 35 and w["condition"] in T.WEATHER_CONDITIONS
    assert T.get_weather("paris", today=day) == w  # case-insensitive, canonical name back
    assert T.get_weather("Atlantis") == {"city": "Atlantis", "error": "unknown city"}


def test_time_uses_the_real_time_zone():
    noon_utc = dt.datetime(2026, 1, 15, 12, 0, tzinfo=dt.timezone.utc)
    assert T.get_time("Tokyo", now=noon_utc)["local_time"] == "21:00"
    assert T.get_time("New York", now=noon_utc)["local_time"] == "07:00"
    assert T.get_time("Kathmandu", now=noon_utc)["local_time"] == "17:45"


@pytest.mark.parametrize("expr, result", [("12 * (3 + 4)", 84), ("7 / 2", 3.5), ("2 ^ 10", 1024), ("10 / 3", 3.33)])
def test_calculator(expr, result):
    assert T.calculator(expr)["result"] == result


@pytest.mark.parametrize("expr", ["__import__('os')", "1 / 0", "2 ** 1000", "abc"])
def test_calculator_refuses_bad_input_with_an_error_result(expr):
    assert "error" in T.calculator(expr)


def test_convert_units():
    assert T.convert_units(10, "km", "mi")["result"] == 6.21
    assert T.convert_units(100, "C", "F")["result"] == 212
    assert "cannot convert" in T.convert_units(1, "kg", "km")["error"]
    assert "unknown unit" in T.convert_units(1, "parsec", "km")["error"]


def test_call_tool_handles_model_mistakes():
    assert T.call_tool("get_weather", '{"city": "Oslo"}')["city"] == "Oslo"
    assert "unknown tool" in T.call_tool("search_web", "{}")["error"]
    assert "not valid JSON" in T.call_tool("calculator", "{oops")["error"]
    assert "bad arguments" in T.call_tool("get_time", {"town": "Oslo"})["error"]


def test_tool_schemas_have_the_required_names_and_parameters():
    params = {t["function"]["name"]: set(t["function"]["parameters"]["properties"]) for t in T.TOOLS}
    assert params == {"get_weather": {"city"}, "calculator": {"expression"},
                      "convert_units": {"value", "from_unit", "to_unit"}, "get_time": {"city"}}
