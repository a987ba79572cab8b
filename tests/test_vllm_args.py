"""The one model of vLLM arguments: flags, their --no- forms, model and served name, and changes in words."""

from helpers.core.vllm_args import (EngineConfig, config_from_args, describe_change, flag_name, flag_value, flags, parse_args,
                               server_args, with_flag)

ARGS = ("--max-model-len", "4096", "--enforce-eager", "--tool-call-parser", "hermes")


def test_flag_names_are_canonical_in_every_spelling():
    assert {flag_name(f) for f in ("max_num_seqs", "--max-num-seqs", "--max_num_seqs=8", "max-num-seqs",
                                   "--no-max-num-seqs")} == {"--max-num-seqs"}


def test_with_flag_replaces_appends_and_removes():
    assert flag_value(with_flag(ARGS, "--max-model-len", 2048), "max_model_len") == "2048"
    assert with_flag(ARGS, "max-num-seqs", 8)[-2:] == ("--max-num-seqs", "8")
    assert flag_value(with_flag(ARGS, "--enforce-eager", None), "--enforce-eager") is None
    assert flag_value(ARGS, "--enforce-eager") is True
    spec = with_flag(ARGS, "--speculative-config", {"method": "ngram", "num_speculative_tokens": 3})
    assert flag_value(spec, "--speculative-config") == '{"method": "ngram", "num_speculative_tokens": 3}'


def test_false_writes_the_no_form_and_replaces_the_positive_one():
    off = with_flag(ARGS, "--enforce-eager", False)
    assert "--enforce-eager" not in off and off[-1] == "--no-enforce-eager"
    assert flag_value(off, "enforce_eager") is False
    assert flag_value(with_flag(off, "--enforce-eager", True), "--enforce-eager") is True
    assert with_flag(("--no-enable-prefix-caching",), "--enable-prefix-caching", None) == ()


def test_with_flag_understands_equals_form():
    args = ("--max-num-seqs=16", "--enforce-eager")
    assert flag_value(args, "--max-num-seqs") == "16"
    assert with_flag(args, "--max-num-seqs", 32) == ("--enforce-eager", "--max-num-seqs", "32")
    assert flags(args + ("--no-enable-prefix-caching",)) == {"--max-num-seqs": "16", "--enforce-eager": True,
                                                               "--enable-prefix-caching": False}


def test_parse_args_reads_flag_equals_and_positional_forms():
    assert parse_args(["--model", "m", "--served-model-name", "s", "--max-num-seqs", "8"]) == (
        "m", "s", ("--max-num-seqs", "8"), False)
    assert parse_args(["--model=m", "--enforce-eager"]) == ("m", "m", ("--enforce-eager",), False)
    assert parse_args(["m", "--served-model-name", "a", "b", "--enforce-eager"]) == ("m", "a", ("--enforce-eager",), True)
    config = EngineConfig("m", "s", ("--x", "1"))
    assert parse_args(server_args(config, positional=True))[:3] == ("m", "s", ("--x", "1"))


def test_a_command_line_round_trips_to_its_configuration():
    config = EngineConfig("/models/tiny", "tiny", ("--max-num-seqs", "8", "--no-enable-prefix-caching"))
    line = [*server_args(config), "--host", "127.0.0.1", "--port", "8000"]
    assert config_from_args(line, drop=("--host", "--port")) == config
    assert config_from_args(["--max-num-seqs", "8"]) is None  # no model named


def test_describe_change_names_each_difference():
    old = EngineConfig("m", "m", ("--max-num-seqs", "32", "--enforce-eager"))
    new = EngineConfig("m", "m", ("--max-num-seqs", "64", "--kv-cache-dtype", "fp8"), (("A", "1"),))
    assert describe_change(old, new) == "--max-num-seqs 32 -> 64, --kv-cache-dtype fp8 added, --enforce-eager removed, env A=1"
    assert describe_change(old, old) == "a restart on the same configuration"
    assert describe_change(old, EngineConfig("m", "m", ("--max-num-seqs", "32", "--no-enforce-eager"))) == \
        "--enforce-eager True -> False"
