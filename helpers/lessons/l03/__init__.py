"""What notebook 03 (prefill, decode and the KV cache) needs beyond the floors below: attention by hand, the
generation loop, prefill against decode, the KV cache on the live engine, the prefix cache's block-hash chain (and
the verdicts on reusing a prefix's KV from a tier of the memory hierarchy), a long prefill stalling running decodes,
continuous batching and PagedAttention shown on the live engine, the paged KV cache drawn from a run, and the code
exercise's check, one module each. The notebook imports from this package alone (and ``helpers.engine.session``):
what it uses of those modules and of the floors is re-exported here (``__all__``); ``attention``, ``batching``,
``pictures`` and ``prefix_hash`` as modules.
"""

from helpers.core.models import by_profile
from helpers.core.conclusion import report
from helpers.core.lesson import (check_exercise, check_prediction, should_see, should_see_conclusion,
                                 show_conclusions, show_solution)
from helpers.core.settings import models_dir
from helpers.core.vllm_args import flag_value
from helpers.hardware.gpus import GPUS, get_gpu
from helpers.hardware.machine import check_quiet
from helpers.lessons import plots
from helpers.lessons.l02_memory import block_size_note
from helpers.lessons.l03 import attention, batching, pictures, prefix_hash
from helpers.lessons.l03.generation_loop import compare_loops, conclude_loops, load_model, loop_summary, steps_frame
from helpers.lessons.l03.batching import small_pool_flags
from helpers.lessons.l03.exercises import BLOCKS_HINT, blocks_check, blocks_on_this_run
from helpers.lessons.l03.interference import (budget_name, conclude_stall, measure_stall_configs, stall_gaps,
                                              stall_table)
from helpers.lessons.l03.kv_cache import (MIDDLE_CHOICES, conclude_agent_cache, conclude_break_cache,
                                          conclude_kv_peak, conclude_machine_reuse, conclude_prefix_cache,
                                          conclude_tiers, expected_blocks, measure_break_cache, measure_prefix_cache,
                                          middle_change_outcome, sample_long_request)
from helpers.lessons.l03.prefill import conclude_prefill_decode, measure_prefill_decode, prefill_table
from helpers.measure.bench_results import requests_frame
from helpers.measure.loadgen import run_load
from helpers.measure.server_metrics import scrape, window
from helpers.measure.workloads import Load, Workload
from helpers.planning import kv_reuse
from helpers.planning.shape import REFERENCE_CONFIGS

__all__ = [
    # this notebook's own, from the modules of this package
    "attention", "batching", "pictures", "prefix_hash", "small_pool_flags", "compare_loops", "conclude_loops", "load_model",
    "loop_summary", "steps_frame", "budget_name", "conclude_stall",
    "measure_stall_configs", "stall_gaps", "stall_table", "conclude_agent_cache", "conclude_break_cache",
    "conclude_kv_peak", "conclude_machine_reuse", "conclude_prefix_cache", "conclude_tiers", "expected_blocks",
    "measure_break_cache", "measure_prefix_cache", "sample_long_request", "conclude_prefill_decode",
    "measure_prefill_decode", "prefill_table", "BLOCKS_HINT", "blocks_check", "blocks_on_this_run",
    "MIDDLE_CHOICES", "middle_change_outcome", "ANSWERS",
    # from notebook 02's lesson and the floors below, for the notebook
    "block_size_note", "report", "check_exercise", "show_solution", "check_prediction", "should_see",
    "should_see_conclusion", "show_conclusions",
    "models_dir", "flag_value", "GPUS", "get_gpu", "check_quiet", "plots", "requests_frame", "run_load", "scrape",
    "window", "Load", "Workload", "kv_reuse", "REFERENCE_CONFIGS",
    "by_profile",
]

# issue 42: what gives each core-path check's answer away; tests/test_core_path.py fails if a phrase shows above it
ANSWERS: dict[str, tuple[str, ...]] = {
    "Write it yourself: the KV blocks a request holds": ("divide, then round up",
                                                         "a partly filled last block is a whole block"),
    "Exercise 1: change a token in the middle instead": ("before the changed token is reused",),
}
