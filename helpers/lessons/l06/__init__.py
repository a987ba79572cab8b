"""What notebook 06 (speculative decoding) needs beyond the floors below, one module each: the methods (the
``--speculative-config`` of a method, the method map, prompt lookup by hand), the runs (methods interleaved with the
baseline on real agent traffic), the verdicts (speed against the spread, acceptance, the formula against the
counters), the cost (c per guess, E / (1 + k c) against the measured speed-up, the talk's example, batching) and
losslessness (a permutation test of the sampled tokens with and without speculation), the accept/reject rule
(sampling) and the draft-then-verify picture of one stream (picture). The notebook imports from this
package alone (and ``helpers.engine.session``): what it uses of those modules and of the floors is re-exported here.

A draft proposes ``num_speculative_tokens`` tokens; the target model checks them all in one forward pass and keeps
the longest agreeing prefix plus one token of its own. The server counts drafts, draft tokens and accepted tokens
(``helpers.measure.server_metrics``); the client sees several tokens arrive per chunk.
"""

from helpers.core.conclusion import report
from helpers.core.models import by_profile, lesson_model, workshop_gpu
from helpers.core.lesson import check_exercise, check_prediction, should_see, should_see_conclusion, show_solution
from helpers.evals.suite import compare
from helpers.hardware.machine import check_quiet
from helpers.lessons import plots
from helpers.lessons.l06.cost import (PUBLISHED_GPU, TALK_EXAMPLE, arithmetic_sentence, arithmetic_table,
                                      batching_conclusion, cost_conclusion, cost_table, gpu_beside_cpu, step_arithmetic,
                                      talk_speedups)
from helpers.lessons.l06.exercises import tokens_per_step_check
from helpers.lessons.l06.lossless import (FIXED_SAMPLE, format_p, lossless_pair, lossless_sampler, lossless_tests,
                                          permutation_test, sample_continuations, samples_summary)
from helpers.lessons.l06.methods import (METHODS, copied_text_lookup, draft_methods, installed_spec_methods,
                                         lookup_outcome, method_map, prompt_lookup_length, spec_config)
from helpers.lessons.l06.picture import draft_then_verify, steps_summary, verify_steps
from helpers.lessons.l06.runs import (BASELINE, SPEC_FLAG, agent_workload, baseline_tok_s, complete_rounds, mean_runs,
                                      measure_speculation, per_k, run_methods, stream_chunk_tokens)
from helpers.lessons.l06.sampling import accept_probability, output_distribution, residual, verify_token
from helpers.lessons.l06.verdicts import (SPEED_CHOICES, acceptance_conclusion, aligned_vs_misaligned,
                                          core_conclusions, formula_conclusion, k_conclusion, length_gain_outcome,
                                          lowest_concurrency_conclusion, method_conclusion, one_stream_outcome,
                                          speculation_caveat, speculation_conclusions, speedups, trend_conclusion)
from helpers.engine.spec_sampling_fix import FIX_ENV
from helpers.measure.results_file import measure_or_load, results_dir
from helpers.planning.acceptance import expected_accepted_length, expected_length_table, more_guesses

# issue 42: what gives each core-path check's answer away; tests/test_core_path.py fails if a phrase shows above it
ANSWERS: dict[str, tuple[str, ...]] = {
    "Write it yourself: tokens per step, from the accept rule": ("2.533", "1 + a + a^2", "a geometric sum"),
    "Exercise 1: the aligned draft on one stream, on this machine": (
        "outweighed the step's cost", "one speculative step took", "is inside the run-to-run spread",
        "much of a decode step is fixed work"),
}

__all__ = [
    # this notebook's own, from the modules of this package
    "PUBLISHED_GPU", "TALK_EXAMPLE", "arithmetic_sentence", "arithmetic_table", "batching_conclusion",
    "cost_conclusion", "cost_table", "gpu_beside_cpu", "step_arithmetic", "talk_speedups", "FIXED_SAMPLE", "format_p", "lossless_pair",
    "lossless_sampler", "lossless_tests",
    "permutation_test", "sample_continuations", "samples_summary", "METHODS", "copied_text_lookup",
    "installed_spec_methods", "draft_methods", "lookup_outcome", "method_map", "prompt_lookup_length", "spec_config",
    "BASELINE",
    "SPEC_FLAG", "agent_workload", "baseline_tok_s", "complete_rounds", "mean_runs", "measure_speculation", "per_k",
    "run_methods", "stream_chunk_tokens", "draft_then_verify", "steps_summary", "verify_steps",
    "accept_probability", "output_distribution", "residual", "verify_token", "tokens_per_step_check",
    "acceptance_conclusion", "aligned_vs_misaligned", "formula_conclusion", "k_conclusion", "length_gain_outcome",
    "lowest_concurrency_conclusion", "method_conclusion", "speculation_caveat", "speculation_conclusions", "speedups",
    "trend_conclusion", "SPEED_CHOICES", "core_conclusions", "one_stream_outcome", "ANSWERS",
    # from the floors below, for the notebook
    "report", "check_exercise", "show_solution", "check_prediction", "measure_or_load", "results_dir", "expected_accepted_length", "should_see", "should_see_conclusion", "compare", "check_quiet", "plots",
    "FIX_ENV", "expected_length_table", "more_guesses", "by_profile", "lesson_model", "workshop_gpu",
]
