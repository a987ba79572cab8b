import itertools
import json

from helpers.tiny import corpus
from helpers.tiny.tools import TOOL_NAMES, city_catalog


def test_heldout_phrasings_never_appear_in_training():
    heldout = {t for lst in (corpus.WEATHER_Q, corpus.TIME_Q, corpus.CALC_Q, corpus.CONVERT_Q)
               for t in corpus.split_templates(lst, heldout=True)}
    train = {t for lst in (corpus.WEATHER_Q, corpus.TIME_Q, corpus.CALC_Q, corpus.CONVERT_Q)
             for t in corpus.split_templates(lst, heldout=False)}
    assert heldout and not heldout & train


def test_heldout_cases_name_catalog_cities_and_expect_real_tools():
    cases = corpus.heldout_cases(n_per_kind=10)
    assert {c.kind for c in cases} == {"weather", "time", "calculator", "convert", "chat"}
    for c in cases:
        if c.expected_call:
            assert c.expected_call["name"] in TOOL_NAMES
            if "city" in c.expected_call["arguments"]:
                assert c.expected_call["arguments"]["city"] in city_catalog()
        else:
            assert c.kind == "chat"


def test_novel_cities_are_outside_the_catalog():
    assert not set(corpus.NOVEL_CITIES) & set(city_catalog())


def test_training_stream_is_reproducible_and_tool_results_are_consistent():
    a = list(itertools.islice(corpus.training_conversations(3), 50))
    b = list(itertools.islice(corpus.training_conversations(3), 50))
    assert a == b
    for messages, _ in a:
        for i, m in enumerate(messages):
            if m.get("tool_calls"):
                result = json.loads(messages[i + 1]["content"])
                args = json.loads(m["tool_calls"][0]["function"]["arguments"])
                assert result.get("city", args.get("city")) == args.get("city", result.get("city"))


def test_composed_phrasings_never_equal_a_heldout_template():
    heldout = {corpus._normalized(t) for lst in (corpus.WEATHER_Q, corpus.TIME_Q, corpus.CALC_Q, corpus.CALC_EXPR_Q,
                                                 corpus.CONVERT_Q) for t in corpus.split_templates(lst, heldout=True)}
    composed = corpus.augmented_templates()
    assert all(len(v) >= 10 for v in composed.values())
    assert not {corpus._normalized(t) for v in composed.values() for t in v} & heldout


def test_stage1_stream_does_not_change_when_augmentation_exists():
    plain = list(itertools.islice(corpus.training_conversations(5), 30))
    augmented = list(itertools.islice(corpus.training_conversations(5, augment=True), 30))
    assert plain == list(itertools.islice(corpus.training_conversations(5), 30))
    assert plain != augmented
