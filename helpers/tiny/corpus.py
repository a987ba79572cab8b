"""A synthetic agent corpus for the tiny models, with a held-out split of phrasings.

Every conversation is an OpenAI-style message list (user / assistant with ``tool_calls`` / tool),
so the same examples train the model and, through a real endpoint, test it. Tool results in the
corpus come from the real tool functions in ``helpers.tiny.tools``.

Held-out phrasings: of each list of question templates, every fifth (index % 5 == 4) is never used
for training. ``heldout_cases`` draws only from those, naming catalog cities and numbers in range;
``novel_name_cases`` names real cities that are not in the catalog (and so are not single tokens),
the stretch test of copying names the model never saw.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from dataclasses import dataclass, field
from typing import Any, Iterator

from helpers.tiny import tools as T

HELD_OUT_EVERY = 5  # template index % 5 == 4 is held out

# Corpus tool results use a clock drawn from the seeded generator (any minute of one year), so a
# rebuild is reproducible and the model must copy times and temperatures rather than memorize them.
CORPUS_START = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
NUMBER_TOKENS_MAX = 1999  # integers 0..1999 are single tokens in the tiny tokenizer

WEATHER_Q = [
    "What's the weather in {city}?",
    "How is the weather in {city} today?",
    "weather {city}",
    "Is it raining in {city}?",
    "Tell me the weather for {city}.",
    "What is the temperature in {city} right now?",
    "how hot is it in {city}",
    "Do I need a jacket in {city} today?",
    "Check the weather in {city} please.",
    "What's it like outside in {city}?",
    "I'm flying to {city} tomorrow, how's the weather there?",
    "Could you look up the current weather in {city}?",
    "{city} weather?",
    "Is it cold in {city}?",
    "Give me the forecast for {city}.",
    "what is the weather like in {city} at the moment",
    "Any idea how warm it is in {city}?",
    "Please get me the weather conditions in {city}.",
    "Is it sunny in {city} today?",
    "How's the weather over in {city}?",
]
TIME_Q = [
    "What time is it in {city}?",
    "What's the local time in {city}?",
    "time in {city}",
    "Tell me the current time in {city}.",
    "What time is it now in {city}?",
    "Could you check the clock in {city}?",
    "Is it late in {city} right now?",
    "I need to call someone in {city}, what time is it there?",
    "{city} time?",
    "current time {city}",
    "Do you know what time it is in {city}?",
    "What hour is it in {city}?",
    "Please tell me the time in {city}.",
    "Is it morning or evening in {city}?",
    "Look up the local time for {city}.",
]
CALC_OPS = {  # spoken form -> symbol
    "+": ["plus", "+", "added to"],
    "-": ["minus", "-", "take away"],
    "*": ["times", "*", "multiplied by", "x"],
    "/": ["divided by", "/", "over"],
}
CALC_Q = [
    "What is {a} {op} {b}?",
    "Calculate {a} {op} {b}.",
    "{a} {op} {b} = ?",
    "compute {a} {op} {b}",
    "How much is {a} {op} {b}?",
    "Can you work out {a} {op} {b}?",
    "Please calculate {a} {op} {b} for me.",
    "what's {a} {op} {b}",
    "Quick math: {a} {op} {b}",
    "Solve {a} {op} {b}.",
    "I need the result of {a} {op} {b}.",
    "Evaluate {a} {op} {b}.",
    "Use the calculator: {a} {op} {b}",
    "Help me with {a} {op} {b}.",
    "Tell me {a} {op} {b}.",
]
CALC_EXPR_Q = [
    "Calculate {expr}",
    "What is {expr}?",
    "evaluate {expr}",
    "compute {expr} please",
    "What does {expr} come to?",
]
UNIT_WORDS = {
    "km": ["km", "kilometers", "kilometres"],
    "mi": ["miles", "mi"],
    "m": ["meters", "metres", "m"],
    "ft": ["feet", "ft"],
    "cm": ["centimeters", "cm"],
    "in": ["inches", "in"],
    "kg": ["kg", "kilograms", "kilos"],
    "lb": ["pounds", "lb", "lbs"],
    "g": ["grams", "g"],
    "oz": ["ounces", "oz"],
    "l": ["liters", "litres", "l"],
    "gal": ["gallons", "gal"],
    "C": ["celsius", "degrees celsius", "C"],
    "F": ["fahrenheit", "degrees fahrenheit", "F"],
}
UNIT_PAIRS = [("km", "mi"), ("mi", "km"), ("m", "ft"), ("ft", "m"), ("cm", "in"), ("in", "cm"),
              ("kg", "lb"), ("lb", "kg"), ("g", "oz"), ("oz", "g"), ("l", "gal"), ("gal", "l"),
              ("C", "F"), ("F", "C"), ("km", "m"), ("m", "cm"), ("kg", "g"), ("mi", "ft")]
CONVERT_Q = [
    "Convert {v} {u1} to {u2}.",
    "How many {u2} is {v} {u1}?",
    "{v} {u1} in {u2}",
    "What is {v} {u1} in {u2}?",
    "convert {v} {u1} into {u2}",
    "Please change {v} {u1} to {u2}.",
    "I have {v} {u1}, how much is that in {u2}?",
    "{v} {u1} to {u2}?",
    "How much is {v} {u1} in {u2}?",
    "Can you convert {v} {u1} to {u2} for me?",
    "Express {v} {u1} in {u2}.",
    "what's {v} {u1} in {u2}",
    "Turn {v} {u1} into {u2}.",
    "{v} {u1} equals how many {u2}?",
    "Give me {v} {u1} in {u2}.",
]
CHAT = [  # (user phrasings, assistant answer); every fifth phrasing is held out
    (["hi", "Hello!", "hey there", "Good morning", "hello, who is this?", "hey", "Hi there!", "good evening",
      "yo", "hello again", "Greetings!", "morning!", "hiya", "Hello, anyone there?", "hi bot"],
     "Hello! I can check the weather, tell the local time, do arithmetic and convert units. What do you need?"),
    (["thanks", "Thank you!", "thanks, that helped", "great, thank you so much", "cheers", "thx",
      "many thanks", "perfect, thanks", "ok thank you", "thanks a lot!", "that's great, thanks",
      "awesome, thank you", "nice, thanks", "thank you very much", "appreciated"],
     "You're welcome! Anything else?"),
    (["bye", "goodbye", "see you later", "that's all for now", "ok bye", "see ya", "bye bye",
      "talk to you later", "I'm done, bye", "good night", "later!", "that is all", "farewell",
      "ok that's it, goodbye", "catch you later"],
     "Goodbye! Have a nice day."),
    (["what can you do?", "help", "What are your tools?", "how can you help me", "what are you able to do?",
      "what tools do you have?", "what do you know how to do", "list your abilities", "how do I use you?",
      "what kind of questions can I ask?", "show me what you can do", "what are your features?",
      "can you help me?", "what are your skills", "what is this assistant for?"],
     "I can use four tools: get_weather, get_time, calculator and convert_units. Ask me about weather, time, math or units."),
    (["who are you?", "what are you", "are you a human?", "Who made you?", "what model is this?",
      "what's your name?", "are you a robot?", "who built you?", "what are you exactly?",
      "introduce yourself", "are you ChatGPT?", "tell me about yourself", "which model are you?",
      "are you an AI?", "who am I talking to?"],
     "I am a tiny agent model trained for this inference workshop. I call tools to answer."),
    (["tell me a joke", "make me laugh", "say something funny", "do you know any jokes?", "joke please",
      "tell me something funny", "got a joke?", "I need a laugh", "cheer me up with a joke",
      "any good jokes?", "be funny", "tell a joke about computers", "give me a joke", "make a joke",
      "amuse me"],
     "Why did the GPU go to school? To improve its memory bandwidth."),
    (["how are you?", "how's it going", "are you ok?", "how do you feel today?", "what's up",
      "how are things?", "how have you been?", "everything fine?", "how is your day?", "you good?",
      "how are you doing today?", "what's new?", "how do you do?", "are you well?", "how's life?"],
     "I'm running fine, thanks. How can I help?"),
    (["book a flight to {city}", "order a pizza to my hotel in {city}", "find me a hotel in {city}",
      "what's the population of {city}?", "show me a map of {city}", "find restaurants in {city}",
      "how do I get to {city} by train?", "what is {city} famous for?", "rent a car in {city}",
      "who is the mayor of {city}?", "translate this into the language of {city}",
      "buy tickets for a concert in {city}", "what's the history of {city}?", "how big is {city}?",
      "plan a trip to {city}"],
     "Sorry, I can't do that. I can only check weather and time, calculate and convert units."),
    (["write a poem", "translate hello into French", "what is the capital of France?",
      "recommend a good movie", "summarize this article for me", "send an email to my boss",
      "play some music", "what's the news today?", "set an alarm for 7", "write me a story",
      "what is the meaning of life?", "fix my code", "who won the game last night?",
      "order me a coffee", "draw a cat"],
     "Sorry, I can't do that. I can only check weather and time, calculate and convert units."),
]

COPY_Q = ["say {x}", "repeat after me: {x}", "Repeat: {x}", "echo {x}", "please say {x}"]

WEATHER_A = [
    "It is {temperature_c}°C and {condition} in {city}.",
    "In {city} it is {condition} with {temperature_c}°C.",
    "The weather in {city}: {condition}, {temperature_c}°C.",
]
TIME_A = ["It is {local_time} in {city}.", "The local time in {city} is {local_time}."]
CALC_A = ["{expression} = {result}", "The answer is {result}.", "{expression} equals {result}."]
CONVERT_A = ["{value} {from_unit} is {result} {to_unit}.", "That is {result} {to_unit}."]
UNKNOWN_A = ["Sorry, I don't know the city {city}.", "I could not find {city}: unknown city."]

# Real cities that are NOT in the catalog: the stretch test of copying unseen names.
NOVEL_CITIES = ["Timbuktu", "Ushuaia", "Kyzyl", "Tromsdalen", "Nuuk", "Iqaluit", "Yellowknife",
                "Whitehorse", "Hilo", "Ashdod", "Tabriz", "Mashhad", "Herat", "Mandalay", "Luang Prabang",
                "Hue", "Nha Trang", "Ipoh", "Kuching", "Davao", "Iloilo", "Matsuyama", "Kanazawa",
                "Nara", "Jeonju", "Chuncheon", "Lhasa", "Kunming", "Guilin", "Xiamen", "Dalian",
                "Qingdao", "Mysore", "Udaipur", "Varanasi", "Pokhara", "Kandy", "Bukhara", "Khiva",
                "Aktobe"]
SYLLABLES = ["ka", "lo", "mer", "vi", "sa", "dor", "an", "tu", "ri", "bel", "os", "gra", "ne", "pol",
             "za", "mi", "ker", "ul", "ta", "ven", "ho", "li", "rak", "du", "es", "fan", "go", "nis"]


# Stage-2 phrasings, composed from parts so the model keys on intent words rather than whole
# templates. Any composition that matches a held-out template (ignoring case and punctuation) is
# dropped, so the held-out phrasings stay unseen.
OPENERS = ["", "what's the", "what is the", "tell me the", "give me the", "check the", "show me the", "get the",
           "look up the", "I want the", "find the", "can you get the", "I'd like the", "need the"]
WEATHER_WORDS = ["weather", "forecast", "temperature", "conditions", "weather report", "current weather"]
TIME_WORDS = ["time", "local time", "current time", "clock", "hour", "time right now"]
PREPOSITIONS = ["in", "for", "at", "over in"]
CALC_OPENERS = ["", "what is", "calc", "compute", "work out", "figure out", "find", "solve", "calculate",
                "result of", "how much is", "please compute", "can you solve", "math:", "quick:"]
CONVERT_OPENERS = ["convert", "change", "turn", "switch", "express", "please convert", "can you convert", "could you change"]
NOISE_PREFIXES = ["", "", "", "please ", "hey, ", "quick question: ", "hi! ", "ok, ", "so ", "hmm, ", "tell me, "]
NOISE_SUFFIXES = ["", "", "", " please", " thanks", "?", " now", " for me", "!", " thx"]


def _normalized(text: str) -> str:
    return " ".join("".join(ch for ch in text.lower() if ch.isalnum() or ch in "{} ").split())


def augmented_templates() -> dict[str, list[str]]:
    """Composed training phrasings per kind, none equal to a held-out template."""
    heldout = {_normalized(t) for lst in (WEATHER_Q, TIME_Q, CALC_Q, CALC_EXPR_Q, CONVERT_Q)
               for t in split_templates(lst, heldout=True)}
    out = {
        "weather": [f"{o} {w} {p} {{city}}" for o in OPENERS for w in WEATHER_WORDS for p in PREPOSITIONS],
        "time": [f"{o} {w} {p} {{city}}" for o in OPENERS for w in TIME_WORDS for p in PREPOSITIONS],
        "calculator": [f"{o} {{a}} {{op}} {{b}}" for o in CALC_OPENERS],
        "convert": [f"{o} {{v}} {{u1}} {m} {{u2}}" for o in CONVERT_OPENERS for m in ("to", "into", "in")]
                   + [f"how many {{u2}} {v} {{v}} {{u1}}" for v in ("in", "is", "are", "make")],
    }
    return {k: sorted({" ".join(t.split()) for t in v if _normalized(t) not in heldout}) for k, v in out.items()}


def _noisy(rng: random.Random, question: str) -> str:
    question = rng.choice(NOISE_PREFIXES) + question + rng.choice(NOISE_SUFFIXES)
    return question[0].upper() + question[1:] if rng.random() < 0.5 else question


@dataclass
class Example:
    """One conversation, what it tests, and the expected tool call (if any)."""

    kind: str
    messages: list[dict[str, Any]]
    expected_call: dict[str, Any] | None = None
    expected_values: list[str] = field(default_factory=list)  # strings the final answer should contain


def split_templates(templates: list[Any], heldout: bool) -> list[Any]:
    """Training or held-out subset of a template list."""
    return [t for i, t in enumerate(templates) if (i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1) == heldout]


def _call_message(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}]}


def _tool_round(rng: random.Random, kind: str, question: str, name: str, args: dict[str, Any],
                answers: list[str]) -> Example:
    result = _run(name, args, CORPUS_START + dt.timedelta(minutes=rng.randrange(365 * 24 * 60)))
    call_id = f"call_{rng.randrange(10**8):08d}"
    if "error" in result and result.get("error") == "unknown city":
        answer = rng.choice(UNKNOWN_A).format(city=args["city"])
        values = [args["city"]]
    else:
        fields = {**args, **result}
        answer = rng.choice(answers).format(**fields)
        values = [str(result[k]) for k in ("temperature_c", "local_time", "result") if k in result]
    messages = [
        {"role": "user", "content": question},
        _call_message(name, args, call_id),
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result, ensure_ascii=False)},
        {"role": "assistant", "content": answer},
    ]
    return Example(kind, messages, {"name": name, "arguments": args}, values)


def _run(name: str, args: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    if name == "get_time":
        return T.get_time(args["city"], now=now)
    if name == "get_weather":
        return T.get_weather(args["city"], today=now.date())
    return T.call_tool(name, args)


def _number(rng: random.Random, low: int = 0, high: int = 999) -> int:
    """An integer spread over orders of magnitude (small numbers are common)."""
    digits = rng.choice([d for d in (1, 2, 3, 3, 3) if 10 ** (d - 1) <= max(high, 1)])
    return rng.randint(max(low, 0 if digits == 1 else 10 ** (digits - 1)), min(high, 10**digits - 1))


def _fake_city(rng: random.Random) -> str:
    name = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice([2, 2, 3])))
    return name.capitalize()


def make_example(rng: random.Random, kind: str, heldout: bool, city_pool: list[str] | None = None,
                 augment: bool = False) -> Example:
    """One conversation of a given kind, phrased from the training or held-out templates.

    ``augment`` (training only): half the time a composed phrasing, and noise around the question.
    """
    if augment and not heldout and kind in ("weather", "time", "calculator", "convert") and rng.random() < 0.5:
        example = _augmented_example(rng, kind)
    else:
        example = _make_example(rng, kind, heldout, city_pool)
    if augment and not heldout and kind != "copy":
        example.messages[0]["content"] = _noisy(rng, example.messages[0]["content"])
    return example


def _augmented_example(rng: random.Random, kind: str) -> Example:
    template = rng.choice(augmented_templates()[kind])
    if kind in ("weather", "time"):
        city = rng.choice(list(T.city_catalog()))
        name, answers = ("get_weather", WEATHER_A) if kind == "weather" else ("get_time", TIME_A)
        return _tool_round(rng, kind, template.format(city=city), name, {"city": city}, answers)
    if kind == "calculator":
        sym = rng.choice(list(CALC_OPS))
        a, b = _number(rng), _number(rng, 1)
        question = template.format(a=a, b=b, op=rng.choice(CALC_OPS[sym]))
        return _tool_round(rng, kind, question, "calculator", {"expression": f"{a} {sym} {b}"}, CALC_A)
    u1, u2 = rng.choice(UNIT_PAIRS)
    value = _number(rng, 1)
    question = template.format(v=value, u1=rng.choice(UNIT_WORDS[u1]), u2=rng.choice(UNIT_WORDS[u2]))
    return _tool_round(rng, kind, question, "convert_units", {"value": value, "from_unit": u1, "to_unit": u2}, CONVERT_A)


def _make_example(rng: random.Random, kind: str, heldout: bool, city_pool: list[str] | None = None) -> Example:
    cities = city_pool or list(T.city_catalog())
    if kind in ("weather", "time", "unknown"):
        asks_weather = kind == "weather" or (kind == "unknown" and rng.random() < 0.5)
        templates = split_templates(WEATHER_Q if asks_weather else TIME_Q, heldout)
        name = "get_weather" if asks_weather else "get_time"
        city = _fake_city(rng) if kind == "unknown" and city_pool is None else rng.choice(cities)
        answers = WEATHER_A if name == "get_weather" else TIME_A
        return _tool_round(rng, kind, rng.choice(templates).format(city=city), name, {"city": city}, answers)
    if kind == "calculator":
        if rng.random() < 0.2:
            a, b, c = _number(rng), _number(rng), _number(rng, 1, 99)
            expr = rng.choice([f"({a} + {b}) * {c}", f"{a} * {b} - {c}", f"{a} / ({b} + {c})", f"{a} - {b} + {c}"])
            question = rng.choice(split_templates(CALC_EXPR_Q, heldout)).format(expr=expr)
        else:
            sym = rng.choice(list(CALC_OPS))
            a, b = _number(rng), _number(rng, 1)
            expr = f"{a} {sym} {b}"
            question = rng.choice(split_templates(CALC_Q, heldout)).format(a=a, b=b, op=rng.choice(CALC_OPS[sym]))
        return _tool_round(rng, kind, question, "calculator", {"expression": expr}, CALC_A)
    if kind == "convert":
        u1, u2 = rng.choice(UNIT_PAIRS)
        value: int | float = _number(rng, 1)
        if rng.random() < 0.15:
            value = value + rng.randint(1, 9) / 10
        question = rng.choice(split_templates(CONVERT_Q, heldout)).format(
            v=value, u1=rng.choice(UNIT_WORDS[u1]), u2=rng.choice(UNIT_WORDS[u2]))
        args = {"value": value, "from_unit": u1, "to_unit": u2}
        return _tool_round(rng, kind, question, "convert_units", args, CONVERT_A)
    if kind == "copy":  # a drill: repeat catalog cities and numbers, so copying works for every token
        items = [rng.choice(cities) if rng.random() < 0.5 else str(rng.randint(0, NUMBER_TOKENS_MAX))
                 for _ in range(rng.randint(1, 3))]
        text = " ".join(items)
        question = rng.choice(split_templates(COPY_Q, heldout)).format(x=text)
        return Example(kind, [{"role": "user", "content": question}, {"role": "assistant", "content": text}])
    if kind == "chat":
        phrasings, answer = rng.choice(CHAT)
        question = rng.choice(split_templates(phrasings, heldout)).format(city=rng.choice(cities))
        return Example(kind, [{"role": "user", "content": question}, {"role": "assistant", "content": answer}])
    raise ValueError(f"unknown example kind {kind!r}")


TRAIN_MIX = {"weather": 0.2, "time": 0.15, "calculator": 0.18, "convert": 0.18, "chat": 0.14, "unknown": 0.07,
             "copy": 0.08}


def training_conversations(seed: int, augment: bool = False) -> Iterator[tuple[list[dict[str, Any]], bool]]:
    """An endless stream of (messages, with_tools) for training; a third start with an earlier exchange."""
    rng = random.Random(seed)
    kinds, weights = zip(*TRAIN_MIX.items())
    while True:
        kind = rng.choices(kinds, weights)[0]
        example = make_example(rng, kind, heldout=False, augment=augment)
        messages = example.messages
        if rng.random() < 0.33:
            earlier = make_example(rng, rng.choices(kinds, weights)[0], heldout=False, augment=augment)
            messages = earlier.messages + messages
        yield messages, not (kind == "chat" and rng.random() < 0.3)


def heldout_cases(n_per_kind: int = 20, seed: int = 1234) -> list[Example]:
    """Held-out phrasings naming catalog cities: the measured tool-call and answer rates."""
    rng = random.Random(seed)
    return [make_example(rng, kind, heldout=True)
            for kind in ("weather", "time", "calculator", "convert", "chat") for _ in range(n_per_kind)]


def novel_name_cases(seed: int = 99) -> list[Example]:
    """Held-out phrasings naming real cities outside the catalog (the stretch goal)."""
    rng = random.Random(seed)
    return [make_example(rng, "unknown", heldout=True, city_pool=[city]) for city in NOVEL_CITIES]
