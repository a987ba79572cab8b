"""The four agent tools: their JSON schemas (what the model sees) and their implementations.

The weather and time tools know a catalog of real cities (``helpers/data/cities.csv``) and answer
``unknown city`` for anything else, as a real service would. Local time is real (IANA time zones
via ``zoneinfo``); the weather is simulated, deterministic per city and day, because this kit runs
without network access.
"""

from __future__ import annotations

import ast
import csv
import datetime as dt
import functools
import hashlib
import json
import operator
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable
from zoneinfo import ZoneInfo

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / ** and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 12 * (3 + 4)"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_units",
            "description": "Convert a value between units of length, mass, volume or temperature.",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {"type": "number"},
                    "from_unit": {"type": "string"},
                    "to_unit": {"type": "string"},
                },
                "required": ["value", "from_unit", "to_unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current local time in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    },
]

TOOL_NAMES: tuple[str, ...] = tuple(t["function"]["name"] for t in TOOLS)

WEATHER_CONDITIONS = ("sunny", "cloudy", "rainy", "windy", "foggy", "clear", "snowy")


@dataclass(frozen=True)
class City:
    """One catalog entry."""

    name: str
    country: str
    timezone: str


@functools.lru_cache(maxsize=1)
def city_catalog() -> dict[str, City]:
    """The catalog of known cities, keyed by name."""
    text = resources.files("helpers").joinpath("data/cities.csv").read_text(encoding="utf-8")
    rows = csv.DictReader(text.splitlines())
    return {r["city"]: City(r["city"], r["country"], r["timezone"]) for r in rows}


def find_city(name: str) -> City | None:
    """Look a city up by name, ignoring case and surrounding spaces."""
    catalog = city_catalog()
    if name in catalog:
        return catalog[name]
    folded = {k.casefold(): v for k, v in catalog.items()}
    return folded.get(str(name).strip().casefold())


def simulated_temperature_c(city: str, day: dt.date) -> int:
    """A deterministic, simulated temperature in degrees Celsius for a city on a day."""
    digest = hashlib.sha256(f"{city}|{day.isoformat()}".encode()).digest()
    return digest[0] % 41 - 5  # -5 .. 35


def get_weather(city: str, *, today: dt.date | None = None) -> dict[str, Any]:
    """Simulated current weather for a catalog city."""
    known = find_city(city)
    if known is None:
        return {"city": city, "error": "unknown city"}
    day = today or dt.date.today()
    temp = simulated_temperature_c(known.name, day)
    digest = hashlib.sha256(f"{known.name}|{day.isoformat()}|sky".encode()).digest()
    conditions = WEATHER_CONDITIONS if temp <= 2 else WEATHER_CONDITIONS[:-1]
    return {"city": known.name, "temperature_c": temp, "condition": conditions[digest[1] % len(conditions)]}


def get_time(city: str, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """Real local time (HH:MM, 24-hour clock) in a catalog city."""
    known = find_city(city)
    if known is None:
        return {"city": city, "error": "unknown city"}
    instant = now or dt.datetime.now(dt.timezone.utc)
    local = instant.astimezone(ZoneInfo(known.timezone))
    return {"city": known.name, "local_time": local.strftime("%H:%M")}


_BINARY_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def evaluate_expression(expression: str) -> float:
    """Evaluate an arithmetic expression safely (numbers, + - * / // % **, parentheses)."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _BINARY_OPS[type(node.op)](left, right)
        raise ValueError(f"unsupported element: {ast.dump(node)[:40]}")

    expr = str(expression).replace("^", "**").replace("×", "*").replace("÷", "/")
    return walk(ast.parse(expr, mode="eval"))


def format_number(value: float) -> int | float:
    """The value rounded to 2 decimals; an integer when that is whole (28.995 -> 29)."""
    rounded = round(float(value), 2)
    return int(rounded) if rounded.is_integer() else rounded


def calculator(expression: str) -> dict[str, Any]:
    """Evaluate an arithmetic expression."""
    try:
        return {"expression": expression, "result": format_number(evaluate_expression(expression))}
    except (ValueError, SyntaxError, ZeroDivisionError, TypeError, OverflowError) as err:
        return {"expression": expression, "error": f"cannot evaluate: {err}"}


# Each unit: (dimension, factor to the base unit); temperatures are handled apart.
UNITS: dict[str, tuple[str, float]] = {
    "km": ("length", 1000.0),
    "m": ("length", 1.0),
    "cm": ("length", 0.01),
    "mi": ("length", 1609.344),
    "ft": ("length", 0.3048),
    "in": ("length", 0.0254),
    "kg": ("mass", 1.0),
    "g": ("mass", 0.001),
    "lb": ("mass", 0.45359237),
    "oz": ("mass", 0.028349523125),
    "l": ("volume", 1.0),
    "gal": ("volume", 3.785411784),
    "C": ("temperature", 1.0),
    "F": ("temperature", 1.0),
}


def _to_celsius(value: float, unit: str) -> float:
    return value if unit == "C" else (value - 32.0) * 5.0 / 9.0


def _from_celsius(value: float, unit: str) -> float:
    return value if unit == "C" else value * 9.0 / 5.0 + 32.0


def convert_units(value: float, from_unit: str, to_unit: str) -> dict[str, Any]:
    """Convert a value between two units of the same dimension."""
    if from_unit not in UNITS or to_unit not in UNITS:
        return {"error": f"unknown unit; known units: {', '.join(UNITS)}"}
    (dim_a, fa), (dim_b, fb) = UNITS[from_unit], UNITS[to_unit]
    if dim_a != dim_b:
        return {"error": f"cannot convert {dim_a} to {dim_b}"}
    try:
        number = float(value)
    except (TypeError, ValueError):
        return {"error": f"value is not a number: {value!r}"}
    if dim_a == "temperature":
        result = _from_celsius(_to_celsius(number, from_unit), to_unit)
    else:
        result = number * fa / fb
    return {"value": format_number(number), "from_unit": from_unit, "to_unit": to_unit,
            "result": format_number(result)}


TOOL_FUNCTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "get_weather": get_weather,
    "calculator": calculator,
    "convert_units": convert_units,
    "get_time": get_time,
}


def call_tool(name: str, arguments: str | dict[str, Any]) -> dict[str, Any]:
    """Run one tool call as a model produced it; bad names or arguments become an error result."""
    if name not in TOOL_FUNCTIONS:
        return {"error": f"unknown tool {name!r}; available: {', '.join(TOOL_NAMES)}"}
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
    except json.JSONDecodeError as err:
        return {"error": f"arguments are not valid JSON: {err.msg}"}
    try:
        return TOOL_FUNCTIONS[name](**args)
    except TypeError as err:
        return {"error": f"bad arguments for {name}: {err}"}
