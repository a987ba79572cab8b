"""The --speculative-config builder (measurement runs against the real engine in notebook 06)."""

import json

import pytest

from helpers.settings import models_dir
from helpers.speculative import spec_config


def test_ngram_gets_prompt_lookup_defaults():
    config = json.loads(spec_config("ngram", 3))
    assert config == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def test_a_shipped_draft_resolves_to_its_directory_and_a_hub_id_stays():
    assert json.loads(spec_config("draft_model", 2, model="tiny-agent"))["model"] == str(models_dir() / "tiny-agent")
    assert json.loads(spec_config("draft_model", 2, model="Qwen/Qwen3-0.6B"))["model"] == "Qwen/Qwen3-0.6B"


@pytest.mark.parametrize("args, message", [(("draft_model", 2), "needs model"), (("eagle", 2), "unknown method"),
                                           (("ngram", 0), ">= 1")])
def test_bad_configs_say_what_to_change(args, message):
    with pytest.raises(ValueError, match=message):
        spec_config(*args)
