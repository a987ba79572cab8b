"""The trainer's model shapes: the MoE sibling and the draft share the agent's vocabulary."""

import json
from pathlib import Path

import pytest

from helpers.planning.shape import count_params
from helpers.tiny.build import DRAFT_SHAPE, ModelShape, MoeShape, build_sibling, model_config

MODELS = Path(__file__).resolve().parents[1] / "models"


def test_moe_shape_is_a_qwen3_moe_whose_active_mlp_equals_the_dense_one():
    moe, dense = model_config(MoeShape(), 3968, 2, 0), model_config(ModelShape(), 3968, 2, 0)
    assert moe.model_type == "qwen3_moe" and dense.model_type == "qwen3"
    moe_counts, dense_counts = count_params(moe.to_dict()), count_params(dense.to_dict())
    router = 4 * 256 * 8  # layers x hidden x experts
    assert moe_counts.active == dense_counts.active + router
    assert moe_counts.total > 2.5 * dense_counts.total


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-draft", "tiny-draft-untrained"])
def test_shipped_siblings_share_the_agents_tokenizer_and_vocabulary(name):
    agent = json.loads((MODELS / "tiny-agent" / "config.json").read_text())
    sibling = json.loads((MODELS / name / "config.json").read_text())
    assert sibling["vocab_size"] == agent["vocab_size"]
    assert (MODELS / name / "tokenizer.json").read_bytes() == (MODELS / "tiny-agent" / "tokenizer.json").read_bytes()
    if name.startswith("tiny-draft"):
        assert sibling["num_hidden_layers"] == DRAFT_SHAPE.num_hidden_layers and sibling["hidden_size"] == 128


def test_an_unknown_kind_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown model kind"):
        build_sibling("eagle", tmp_path, 1, MODELS / "tiny-agent")


def test_a_training_batch_pads_ids_with_the_pad_token_and_masks_labels_where_padded():
    from helpers.tiny.build import pad_batch

    ids, mask, labels = pad_batch([([5, 6, 7], [-100, 6, 7]), ([8], [8])], pad=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert labels.tolist() == [[-100, 6, 7], [8, -100, -100]]
