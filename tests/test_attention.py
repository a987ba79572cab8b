"""Attention by hand on the shipped tiny model, the score counts, and the conclusions fed numbers both ways."""

import numpy as np
import pandas as pd
import pytest

from helpers.lessons.l03 import attention
from helpers.core.conclusion import NOT_SHOWN, SHOWN


@pytest.fixture(scope="module")
def tiny():
    from helpers.lessons.l03.generation_loop import load_model
    from helpers.core.settings import models_dir

    return load_model(models_dir() / "tiny-agent")


def test_the_hand_computed_matrix_is_the_models_own_and_causal(tiny):
    model, tokenizer = tiny
    ids = tokenizer("the weather in Paris is sunny")["input_ids"]
    for layer, head in ((0, 0), (model.config.num_hidden_layers - 1, model.config.num_attention_heads - 1)):
        by_hand = attention.attention_by_hand(model, tokenizer, ids, layer, head)
        assert by_hand.weights.shape == (len(ids), len(ids)) and len(by_hand.tokens) == len(ids)
        assert by_hand.masked_weight == 0 and by_hand.max_row_sum_error < 1e-5
        assert attention.conclude_score_matrix(by_hand, attention.model_attention(model, ids, layer, head)).verdict == SHOWN
    # another head's matrix is not this head's: the check can fail
    other = attention.model_attention(model, ids, 0, 1)
    assert attention.conclude_score_matrix(attention.attention_by_hand(model, tokenizer, ids, 0, 0), other).verdict == NOT_SHOWN


def test_bad_layer_head_or_prompt_says_what_to_do(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="layers 0..3"):
        attention.attention_by_hand(model, tokenizer, [5, 6, 7], layer=4)
    with pytest.raises(ValueError, match="heads 0..3"):
        attention.model_attention(model, [5, 6, 7], head=9)
    with pytest.raises(ValueError, match="at least two"):
        attention.attention_by_hand(model, tokenizer, [5])


def test_score_counts_triangle_against_one_row():
    assert attention.scores_per_step(4, cached=False) == 10 and attention.scores_per_step(4, cached=True) == 4
    # a prompt of 3 then 3 new tokens: the prefill's triangle (6), then steps over 4 and 5 tokens
    assert attention.scores_for_generation(3, 3, cached=False) == 6 + 10 + 15
    assert attention.scores_for_generation(3, 3, cached=True) == 6 + 4 + 5
    table = attention.score_counts([1, 9, 99])
    assert table["ratio"].tolist() == [1.0, 5.0, 50.0]


def test_timed_score_work_counts_what_it_times():
    timed = attention.time_score_work(8, 16, 8, repeats=1).set_index("cache")
    assert timed.loc["without", "scores"] == attention.scores_for_generation(16, 8, False)
    assert (timed["seconds"] > 0).all()


def test_score_work_conclusion_both_ways():
    def timed(without_s, with_s):
        return pd.DataFrame([{"cache": "without", "scores": 1000, "seconds": without_s},
                             {"cache": "with KV cache", "scores": 100, "seconds": with_s}])

    assert attention.conclude_score_work(timed(0.01, 0.001)).verdict == SHOWN
    slower = attention.conclude_score_work(timed(0.001, 0.002))
    assert slower.verdict == NOT_SHOWN and "no saving" in slower.text


def test_conclusion_flags_a_matrix_that_looks_ahead():
    weights = np.full((3, 3), 1 / 3)  # rows of 1, but the first token attends to later ones
    leaky = attention.ScoreMatrix(weights, ["a", "b", "c"], 0, 0)
    assert leaky.masked_weight > 0
    assert attention.conclude_score_matrix(leaky, weights).verdict == NOT_SHOWN


def test_growth_outcome_follows_the_time_and_flags_a_time_far_from_the_count():
    def timed(seconds, scores):
        return pd.DataFrame([{"cache": "without", "scores": scores, "seconds": seconds},
                             {"cache": "with KV cache", "scores": 1, "seconds": 1.0}])

    outcome, detail = attention.growth_outcome(timed(1.0, 100), timed(3.8, 370))
    assert outcome == "about 4x" and "3.8x for 3.7x" in detail and "busy" not in detail
    assert attention.growth_outcome(timed(1.0, 100), timed(1.5, 370))[0] == "about 2x"
    outcome, detail = attention.growth_outcome(timed(1.0, 100), timed(44.0, 370))
    assert outcome == "about 8x" and "run the cell again" in detail
