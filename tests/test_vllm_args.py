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


# ---------------------------------------------------------------- a flag a CPU stand-in takes only with its tokens

GPU_LINE = ["--model", "Qwen/Qwen3-4B", "--served-model-name", "Qwen/Qwen3-4B", "--enable-auto-tool-choice",
            "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"]


def test_the_reasoning_parser_is_dropped_for_tiny_agent_with_the_reason():
    from helpers.core.settings import models_dir
    from helpers.core.vllm_args import CPU_STAND_INS, dropped_for_cpu, translate_for_cpu

    root = str(models_dir())
    assert CPU_STAND_INS["Qwen/Qwen3-4B"] == "tiny-agent"  # the default stand-in
    assert dropped_for_cpu(GPU_LINE, root) == {
        "--reasoning-parser": "tiny-agent's tokenizer has no <think> or </think> as one token: vLLM's qwen3 parser "
                              "looks them up by token id"}
    cpu = translate_for_cpu(GPU_LINE, root)
    assert cpu[1] == f"{root}/tiny-agent" and flag_value(cpu, "--reasoning-parser") is None
    assert flag_value(cpu, "--tool-call-parser") == "hermes"  # only the flag it cannot take goes


def test_the_reasoning_parser_is_kept_for_tiny_qwen3_whose_tokenizer_has_the_think_tokens():
    from helpers.core.settings import models_dir
    from helpers.core.vllm_args import CPU_STAND_INS, dropped_for_cpu, tokenizer_tokens, translate_for_cpu

    root = str(models_dir())
    assert {"<think>", "</think>"} <= tokenizer_tokens(models_dir() / "tiny-qwen3")
    stand_ins = {**CPU_STAND_INS, "Qwen/Qwen3-4B": "tiny-qwen3"}
    assert dropped_for_cpu(GPU_LINE, root, stand_ins) == {}
    cpu = translate_for_cpu(GPU_LINE, root, stand_ins)
    assert cpu[:4] == ["--model", f"{root}/tiny-qwen3", "--served-model-name", "Qwen/Qwen3-4B"]
    assert flag_value(cpu, "--reasoning-parser") == "qwen3"


def test_one_think_token_missing_or_no_tokenizer_at_all_drops_the_flag_and_says_which(tmp_path):
    import json

    from helpers.core.vllm_args import dropped_for_cpu, translate_for_cpu

    half = tmp_path / "half-thinker"
    half.mkdir()
    (half / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "<think>": 1}},
                                                     "added_tokens": []}))
    line = ["--model", str(half), "--reasoning-parser", "qwen3"]
    assert dropped_for_cpu(line, str(tmp_path))["--reasoning-parser"].startswith(
        "half-thinker's tokenizer has no </think> as one token")
    (half / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {"2": {"content": "</think>"}}}))
    assert flag_value(translate_for_cpu(line, str(tmp_path)), "--reasoning-parser") == "qwen3"  # now it has both
    gone = ["--model", str(tmp_path / "absent"), "--reasoning-parser", "qwen3"]
    assert dropped_for_cpu(gone, str(tmp_path))["--reasoning-parser"].startswith("absent has no tokenizer files")
    assert dropped_for_cpu(["--model", str(half)], str(tmp_path)) == {}  # nothing to drop when the flag is not set


def test_the_translation_table_says_which_stand_ins_drop_and_which_keep_the_reasoning_parser():
    from helpers.core.vllm_args import CPU_STAND_INS, cpu_translation_table

    rows = {cpu: why for gpu, cpu, why in cpu_translation_table() if gpu.startswith("--reasoning-parser")}
    removed = next(cpu for cpu in rows if cpu.startswith("(removed)"))
    kept = next(cpu for cpu in rows if cpu.startswith("kept"))
    assert set(removed.removeprefix("(removed) for ").split(", ")) == set(CPU_STAND_INS.values())
    assert kept == "kept for tiny-qwen3" and "<think> and </think>" in rows[kept]
