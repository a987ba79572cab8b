"""What notebook 08 (tuning and evaluation) needs beyond the floors below: tuning one flag at a time, deciding
keep or roll back from two scorecard rows, keeping a cumulative log, and writing the final configuration out as an
engine command line or a Kubernetes manifest patch; its conclusions and the outcomes of its exercises.

The rule (``decide``) is deliberately simple and printed with its reasons: a change is kept only when
the eval shows no regression beyond noise, the latency SLO still holds, and it either makes the chosen
throughput better by more than the noise or keeps it (within the noise) while adding KV capacity.

The thresholds come from this machine (``relative_rule``): the latency SLO is a multiple of the baseline's
own p90 TTFT, and the noise margin is the larger of ``min_gain`` and the spread of the baseline's repeated
runs, so a slow machine does not roll back every change and a noisy one does not keep noise.

Go deeper's "your own agent as load" (the agent recorded, replayed beside a synthetic workload) is ``replay.py``.

The notebook imports what it uses from here (``connect`` aside): the floors' names it uses are re-exported in
``__all__``.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import yaml

from helpers.core.comparison import (BETTER, SAME, SINGLE_RUN_NOISE_REL, UNKNOWN, WORSE, compare_samples,
                                     relative_spread)
from helpers.core.models import by_profile
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion, report
from helpers.core.lesson import check_exercise, check_prediction, should_see, should_see_conclusion, show_solution
from helpers.core.vllm_args import CPU_ONLY_FLAGS, EngineConfig, flag_value, server_args
from helpers.core.settings import GPU_MODEL, Settings, models_dir
from helpers.engine.interface import EngineStartError
from helpers.engine.k8s_change import change_one_flag
from helpers.evals.structured import FREE, SCHEMA, run_structured_ab
from helpers.evals.structured import summary as structured_summary
from helpers.evals.suite import compare as compare_evals
from helpers.hardware.machine import check_quiet, flag_skip_reason
from helpers.measure.results_file import ResultsError, load_results, provenance, write_results
from helpers.lessons.l08_tuning.replay import (AGENT_INSTRUCTIONS, Recording, RecordingLab, knee_conclusion, later_turn_conclusion,
                                               load_conclusion, prefix_conclusion, replay_command, replay_conclusions,
                                               run_agent, session_from_run, side_by_side, side_by_side_view, state_dir,
                                               steps, think_time_check, write_recording)

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab

__all__ = [
    # re-exported from the floors below, for the notebook
    "check_prediction", "check_quiet", "models_dir", "report", "should_see", "should_see_conclusion", "show_solution",
    # the engine interface and the eval comparison the mechanism cell's loop calls
    "EngineStartError", "change_one_flag", "check_exercise", "compare_evals", "flag_value",
    # this lesson's own
    "CPU_ONLY_FLAGS", "Decision", "Rule", "TuningLog", "TuningRun", "baseline_restored", "cluster_model",
    "command_line", "decide", "deployment_caveat", "gpu_configuration", "gpu_line_check", "hypothetical_row", "kv_capacity_check",
    "manifest_patch", "measure_repeated", "relative_rule", "rule_outcome", "run_structured_ab", "scorecard_view",
    "structured_summary", "structured_tpot", "structured_validity", "tune_one_flag_at_a_time", "tuning_conclusions",
    "by_profile", "SEARCH_RESULTS", "candidate_flags", "load_search", "resume", "save_search", "same_configuration",
    "search_conclusion", "slo_check_problem", "slo_on_this_run", "SLO_HINT", "ANSWERS",
    # Go deeper, your own agent as load (replay.py): the recording cell's floors and the side-by-side run
    "AGENT_INSTRUCTIONS", "Recording", "RecordingLab", "run_agent", "session_from_run", "state_dir", "steps", "write_recording",
    "knee_conclusion", "later_turn_conclusion", "load_conclusion", "prefix_conclusion", "replay_command",
    "replay_conclusions", "side_by_side", "side_by_side_view", "think_time_check",
]

# issue 42: what gives each core-path check's answer away; tests/test_core_path.py fails if a phrase shows above it
ANSWERS: dict[str, tuple[str, ...]] = {
    "Exercise 1: a small gain": ("a gain inside the noise margin counts as no gain",),
    "Exercise 2: faster, but later first tokens": ("a broken SLO rolls the change back",),
    "Write it yourself: the SLO check": ("includes the limit itself", "at exactly slo_x times it still holds"),
}


@dataclass(frozen=True)
class Rule:
    """What "better" means for this tuning session: one throughput column and optional latency SLO."""

    speed: str  # e.g. "c16_output_tok_s"
    latency: str | None = None  # e.g. "c16_p90_ttft_ms"
    max_latency_ms: float | None = None
    min_gain: float = 0.03  # relative: the noise margin a change must beat
    slo_x: float | None = None  # max_latency_ms = slo_x times the baseline's latency (relative_rule)
    baseline_spread: float | None = None  # the baseline's run-to-run spread (relative), when repeated
    noise_assumed: bool = False  # one baseline run: min_gain includes the assumed single-run noise

    def describe(self) -> str:
        """The rule in one sentence, with this machine's thresholds."""
        margin = f"more than {self.min_gain:.0%}"
        if self.noise_assumed:
            margin += " (one run per configuration: the run-to-run noise is assumed; REPEATS >= 2 measures it)"
        elif self.baseline_spread is not None:
            margin += f" (the larger of the chosen margin and the baseline's run-to-run spread {self.baseline_spread:.0%})"
        text = f"keep a change if {self.speed} improves by {margin}, or holds within it while adding KV capacity"
        if self.latency and self.max_latency_ms is not None:
            slo = f"{self.max_latency_ms:,.0f} ms"
            if self.slo_x is not None:
                slo += f" ({self.slo_x:g}x the baseline's)"
            text += f"; {self.latency} must stay <= {slo}"
        return text + "; and the eval must not regress."


def relative_rule(baseline: dict[str, Any], speed: str, latency: str | None = None, min_gain: float = 0.03,
                  slo_x: float = 1.5) -> Rule:
    """A rule with this machine's thresholds: latency SLO = ``slo_x`` times the baseline row's ``latency``;
    noise margin = the larger of ``min_gain`` and the spread of the baseline's repeated ``speed`` runs (with a
    single run, of ``min_gain`` and the assumed ``SINGLE_RUN_NOISE_REL``)."""
    runs = _runs(baseline, speed)
    spread = relative_spread(runs) if len(runs) >= 2 else None
    base_latency = baseline.get(latency) if latency else None
    return Rule(speed=speed, latency=latency, max_latency_ms=None if base_latency is None else slo_x * base_latency,
                min_gain=max(min_gain, SINGLE_RUN_NOISE_REL if spread is None else spread),
                slo_x=slo_x if base_latency is not None else None, baseline_spread=spread,
                noise_assumed=spread is None)


def _runs(row: dict[str, Any], column: str) -> list[float]:
    """The repeated values of a column (``<column>_runs``), else its single value."""
    runs = row.get(f"{column}_runs")
    if isinstance(runs, (list, tuple)) and runs:
        return [float(v) for v in runs if v is not None]
    value = row.get(column)
    return [] if value is None or value != value else [float(value)]


@dataclass(frozen=True)
class Decision:
    keep: bool
    reasons: tuple[str, ...]
    speed_label: str = ""  # better, worse or no measurable difference (the speed alone, against the noise)


def decide(current: dict[str, Any], candidate: dict[str, Any], rule: Rule, regressed: list[str] | None = None) -> Decision:
    """Keep ``candidate`` over ``current`` (two scorecard rows)? ``regressed``: eval categories that got worse."""
    reasons: list[str] = []
    ok = True
    if regressed:
        ok = False
        reasons.append(f"eval regressed in {', '.join(regressed)}")
    if rule.latency and rule.max_latency_ms is not None:
        value = candidate.get(rule.latency)
        if value is None or value > rule.max_latency_ms:
            ok = False
            reasons.append(f"{rule.latency} {value if value is None else round(value, 1)} ms breaks the "
                           f"{rule.max_latency_ms:g} ms SLO")
    before, after = _runs(current, rule.speed), _runs(candidate, rule.speed)
    if not before or not after:
        return Decision(False, tuple(reasons + [f"no {rule.speed} to compare"]))
    verdict = compare_samples(before, after, higher_is_better=True, single_run_noise_rel=rule.min_gain)
    noise = max(verdict.noise_rel, rule.min_gain)
    gain = verdict.ratio - 1
    label = BETTER if gain > noise else WORSE if gain < -noise else SAME
    kv_more = (candidate.get("kv_capacity_tokens") or 0) > (current.get("kv_capacity_tokens") or 0)
    if label == BETTER:
        reasons.append(f"{rule.speed} {gain:+.1%} (beyond the noise, +/-{noise:.0%})")
    elif kv_more and label == SAME:
        reasons.append(f"{rule.speed} {gain:+.1%}: no measurable difference (+/-{noise:.0%}) with more KV capacity "
                       f"({current.get('kv_capacity_tokens'):,} -> {candidate.get('kv_capacity_tokens'):,} tokens)")
    elif label == SAME:
        ok = False
        reasons.append(f"{rule.speed} {gain:+.1%}: no measurable difference (noise +/-{noise:.0%})")
    else:
        ok = False
        reasons.append(f"{rule.speed} {gain:+.1%}: worse beyond the noise (+/-{noise:.0%})")
    return Decision(ok, tuple(reasons), label)


def measure_repeated(lab: Lab, name: str, concurrencies: list[int], input_len: int, output_len: int,
                     num_requests: int, eval_suite: str | None = "smoke", repeats: int = 2) -> tuple[dict[str, Any], Any]:
    """One scorecard row (helpers.evals.scorecard.measure_config) whose speed columns are the mean of ``repeats``
    back-to-back load runs on the running engine, each kept in ``<column>_runs``; the eval runs once.
    Returns the row and the eval run."""
    from helpers.evals.suite import run_suite
    from helpers.evals.scorecard import measure_config

    run = run_suite(lab, eval_suite) if eval_suite else None
    rows = [measure_config(lab, name, concurrencies, input_len, output_len, num_requests, suite=None,
                           evals_run=run if i == 0 else None) for i in range(max(1, repeats))]
    row = dict(rows[0])
    for column in [k for k in row if k.startswith("c") and k.endswith(("_tok_s", "_ms"))]:
        values = [r.get(column) for r in rows if r.get(column) is not None]
        row[f"{column}_runs"] = values
        row[column] = sum(values) / len(values) if values else None
    return row, run


@dataclass
class TuningLog:
    """The cumulative record: every step tried, its scorecard row and the decision."""

    steps: list[dict[str, Any]] = field(default_factory=list)

    def record(self, change: str, row: dict[str, Any], decision: Decision | None) -> None:
        self.steps.append({"step": len(self.steps), "change": change,
                           "kept": None if decision is None else decision.keep,
                           "why": "baseline" if decision is None else "; ".join(decision.reasons), **row})

    def frame(self):  # -> pandas.DataFrame
        import pandas as pd

        return pd.DataFrame(self.steps)


def tuning_conclusions(scorecard: Any, rule: Rule) -> list[Conclusion]:
    """What the tuning session found (a ``TuningLog.frame()``): the baseline, each change kept or rolled back
    with its reason, and the final configuration against the baseline, judged against the noise margin."""
    first = scorecard.iloc[0].to_dict()
    steps = scorecard.iloc[1:]
    spread = f", run-to-run spread {rule.baseline_spread:.0%}" if rule.baseline_spread is not None else ""
    out = [Conclusion(f"Baseline: {first[rule.speed]:.0f} output tok/s at the top concurrency{spread}, "
                      f"{rule.latency} {first.get(rule.latency) or float('nan'):,.0f} ms, KV capacity "
                      f"{first.get('kv_capacity_tokens') or 0:,} tokens, eval {first.get('all_pass_rate', float('nan')):.0%}.")]
    for _, r in steps.iterrows():
        out.append(Conclusion(f"{r['change']}: {'kept' if r['kept'] == True else 'rolled back'} ({r['why']})."))
    kept = steps[steps.kept == True]  # noqa: E712
    if not len(kept):
        return out + [Conclusion(f"Final: the baseline stays: none of the {len(steps)} changes beat it by more than the "
                                 f"noise margin (+/-{rule.min_gain:.0%}) within the rules.", WITHIN_NOISE)]
    last = kept.iloc[-1].to_dict()
    before, after = _runs(first, rule.speed), _runs(last, rule.speed)
    v = compare_samples(before, after, higher_is_better=True, single_run_noise_rel=rule.min_gain)
    noise = max(v.noise_rel, rule.min_gain)
    gain = v.ratio - 1
    head = (f"Final: {last[rule.speed]:.0f} tok/s ({gain:+.1%} vs baseline), {rule.latency} "
            f"{last.get(rule.latency) or float('nan'):,.0f} ms, KV {last.get('kv_capacity_tokens') or 0:,} tokens, eval "
            f"{last.get('all_pass_rate', float('nan')):.0%}; {len(kept)} of {len(steps)} changes kept")
    if gain > noise:
        return out + [Conclusion(head + f": faster than the baseline beyond the noise (+/-{noise:.0%}).", SHOWN)]
    if gain < -noise:
        return out + [Conclusion(head + f": slower than the baseline beyond the noise (+/-{noise:.0%}): each step was "
                                        "kept against the configuration before it, and small losses added up or the "
                                        "machine slowed down; re-measure the baseline.", NOT_SHOWN)]
    return out + [Conclusion(head + f": no measurable speed difference from the baseline (+/-{noise:.0%}); what was "
                                    "kept bought KV capacity or held speed.", WITHIN_NOISE)]


def cluster_model(settings: Settings) -> str:
    """The model name a cluster serves: the served name on the gpu and k8s profiles; on the CPU profile,
    whose tiny models only exist on this machine, the k8s profile's default MODEL_NAME."""
    return settings.model if settings.profile != "cpu" else GPU_MODEL


def _deployable_model(config: EngineConfig, model: str | None) -> str:
    """``model`` when given; else the configuration's model unless it is a local path (then its served name)."""
    if model:
        return model
    local = config.model.startswith(("/", "./", "../")) or config.model.startswith(str(models_dir()))
    return config.served_name if local else config.model


def command_line(config: EngineConfig, model: str | None = None) -> str:
    """``vllm serve`` with the model (``model``, else the configuration's unless it is a local path), served
    name, flags and environment, shell-quoted."""
    config = replace(config, model=_deployable_model(config, model),
                     served_name=config.served_name if model is None else model)
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in config.env)
    cmd = shlex.join(["vllm", "serve", *server_args(config, positional=True)])
    return f"{env} {cmd}" if env else cmd


def manifest_patch(config: EngineConfig, deployment: str = "vllm", container: str = "vllm",
                   model: str | None = None) -> str:
    """A strategic-merge patch (YAML) that sets the vLLM container's args to ``config`` with the cluster's
    ``model`` (else the configuration's unless it is a local path): add it to an overlay's ``patches:`` in
    k8s/ so the next provisioning starts on the tuned flags."""
    name = _deployable_model(config, model)
    config = replace(config, model=name, served_name=config.served_name if model is None else model)
    patch = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": deployment},
             "spec": {"template": {"spec": {"containers": [{"name": container, "args": server_args(config)}]}}}}
    return yaml.safe_dump(patch, sort_keys=False)


def gpu_configuration(baseline: EngineConfig, final: EngineConfig, profile: str,
                      gpu_baseline: EngineConfig | None = None) -> tuple[EngineConfig, list[str]]:
    """The configuration to write out for a GPU and one line per kept change. On the CPU profile: the GPU profile's
    baseline (``gpu_baseline``, default ``helpers.engine.interface.default_config`` of the gpu profile) plus each
    flag the run kept (``final`` against ``baseline``), marked as measured only on the CPU; the CPU-only flags
    (``CPU_ONLY_FLAGS``) and the CPU engine's environment are left out. Elsewhere ``final`` as it is."""
    from helpers.core.vllm_args import flags, with_flag

    before, after = flags(baseline.args), flags(final.args)
    changed = [(f, v) for f, v in after.items() if before.get(f) != v] + [(f, None) for f in before if f not in after]
    if profile != "cpu":
        return final, [f"- {f} {v if v is not None else '(removed)'}: kept, measured on this {profile} engine"
                       for f, v in changed] or [f"- no change kept: the {profile} baseline as it is"]
    if gpu_baseline is None:
        from helpers.core.settings import load_settings
        from helpers.engine.interface import default_config

        gpu_baseline = default_config(load_settings({"WORKSHOP_PROFILE": "gpu"}))
    args, notes = gpu_baseline.args, []
    for flag, value in changed:
        shown = f"{flag} {value if value is not None else '(removed)'}"
        if flag in CPU_ONLY_FLAGS:
            notes.append(f"- {shown}: kept on the CPU, not carried over ({CPU_ONLY_FLAGS[flag]})")
            continue
        args = with_flag(args, flag, value)
        notes.append(f"- {shown}: kept on the CPU and carried over, measured only on the CPU: measure it on the GPU "
                     "before you trust it")
    notes = notes or ["- no change kept: the GPU profile's baseline as it is"]
    return replace(gpu_baseline, args=args, env=()), notes


def gpu_line_check(command: str) -> tuple[bool, str]:
    """Is a written-out GPU command line free of the CPU lab's workarounds (``CPU_ONLY_FLAGS``, the in-process
    engine core)? (seen, what was found)."""
    from helpers.engine.interface import CPU_ENGINE_ENV

    found = [f for f in CPU_ONLY_FLAGS if f in command.split()] + [k for k, _ in CPU_ENGINE_ENV if k in command]
    return not found, f"CPU-only: {', '.join(found)}" if found else "none of " + ", ".join(
        [*CPU_ONLY_FLAGS, *(k for k, _ in CPU_ENGINE_ENV)])


def deployment_caveat(profile: str) -> Conclusion:
    """What the written-out configuration is worth where it will run."""
    if profile == "cpu":
        return Conclusion("CPU vs GPU: the command and the patch start from the GPU profile's baseline (CUDA graphs "
                          "on, --gpu-memory-utilization as the memory knob) plus the changes this run kept; those were "
                          f"measured on the CPU lab's tiny model, while the cluster serves {GPU_MODEL} on a GPU, where "
                          "the knee lies elsewhere. Run this notebook on the cluster (WORKSHOP_PROFILE=k8s) to measure "
                          "them there.")
    return Conclusion("Tuned on this engine: the same flags on another GPU type need their own run.")


# ---------------------------------------------------------------- the tuning session (notebook 08)

def same_configuration(a: EngineConfig, b: EngineConfig) -> bool:
    """Do two configurations run the same engine: the same model, name and environment and the same flags in any
    order (a flag set back by a roll-back moves to the end of the arguments: that is no reason to restart)."""
    from helpers.core.vllm_args import flags

    return replace(a, args=()) == replace(b, args=()) and flags(a.args) == flags(b.args)


@contextmanager
def baseline_restored(engine: Any, baseline: EngineConfig | None = None, show: Callable[[str], None] = print):
    """Run the block, then put ``engine`` back on ``baseline`` (default: its configuration on entry), also
    when the block raises or is interrupted: a notebook stopped midway leaves the engine on its baseline."""
    from helpers.core.vllm_args import describe_change

    baseline = baseline or engine.config()
    try:
        yield baseline
    finally:
        now = engine.config()
        if not same_configuration(now, baseline):
            show(f"Putting the engine back on its baseline ({describe_change(now, baseline)})...")
            engine.apply(baseline)


@dataclass
class TuningRun:
    """Where a tuning session ended: the kept row and eval, the configuration it reached, each flag change."""

    current: dict[str, Any]
    current_eval: Any
    final: EngineConfig
    changes: list[Any]  # helpers.engine.k8s_change.ManifestChange, one per change the engine accepted


def tune_one_flag_at_a_time(lab: Lab, candidates: list[tuple[str, Any]], measure: Callable[[str], tuple[dict, Any]],
                            current: dict[str, Any], current_eval: Any, rule: Rule, log: TuningLog,
                            model: str | None = None) -> TuningRun:
    """For each (flag, value): change it from the configuration kept so far (as a manifest change:
    helpers/engine/k8s_change.py), ``measure`` it, keep it by ``rule`` or set the flag back; every step goes into
    ``log``. A roll-back is no restart of its own: the next candidate's restart starts from the kept configuration,
    and the engine ends on the last one measured (``final`` is the kept one; ``resume`` puts the engine on it). A
    flag vLLM refuses is rolled back by the engine interface and logged as refused. ``model``: the cluster's model
    for the patches shown."""
    changes = []
    kept = lab.engine.config()
    for flag, value in candidates:
        previous = flag_value(kept.args, flag)
        change = f"{flag} {previous if previous is not None else '(default)'} -> {value}"
        try:
            changes.append(change_one_flag(lab.engine, flag, value, model, base=kept))
        except EngineStartError as err:
            log.record(change, {}, Decision(False, (f"vLLM refused it: {str(err).splitlines()[0]}",)))
            continue
        print(check_quiet(lab).message())
        row, run = measure(change)
        decision = decide(current, row, rule, compare_evals(current_eval, run).regressed)
        log.record(change, row, decision)
        print(f"{'KEEP    ' if decision.keep else 'ROLLBACK'} {change}: {'; '.join(decision.reasons)}")
        if decision.keep:
            current, current_eval, kept = row, run, lab.engine.config()
    return TuningRun(current, current_eval, kept, changes)


def candidate_flags(candidates: list[Any], memory_knob: tuple[str, Any], profile: str | None = None,
                    show: Callable[[str], None] = print) -> list[tuple[str, Any]]:
    """The (flag, value) pairs of a parameters cell's candidates: ``"MEMORY"`` stands for the profile's memory knob.
    With ``profile``, a candidate this engine cannot start with (``flag_skip_reason``: the FP8 KV cache on an
    AVX2-only CPU) is left out with its sentence, before any restart vLLM would refuse."""
    pairs = [tuple(memory_knob) if c == "MEMORY" else tuple(c) for c in candidates]
    kept = []
    for flag, value in pairs:
        reason = flag_skip_reason(flag, value, profile) if profile else None
        if reason:
            show(f"Left out: {flag} {value}. {reason}")
        else:
            kept.append((flag, value))
    return kept


def resume(engine: Any, config: EngineConfig) -> None:
    """Put ``engine`` on ``config`` (where an earlier loop ended) unless it runs it already: no restart for nothing."""
    if not same_configuration(engine.config(), config):
        engine.apply(config)


# ---------------------------------------------------------------- Go deeper: the search, run once for the room

SEARCH_RESULTS = "08-search"  # the results file's name (helpers/measure/results_file.py)


def save_search(lab: Lab, scorecard: Any, parameters: dict[str, Any], name: str = SEARCH_RESULTS) -> Any:
    """Write the search's scorecard as a results file with its provenance (for the room, once) and say where; the
    scorecard back."""
    import pandas as pd

    rows = pd.DataFrame(scorecard).drop(columns=[c for c in scorecard if str(c).endswith("_runs")], errors="ignore")
    path = write_results(name, rows, provenance(lab, parameters))
    print(f"Wrote the search to {path}: put it in the room's WORKSHOP_RESULTS_DIR so attendees on "
          f"{lab.model} on {lab.settings.gpu} read it instead of running it.")
    return scorecard


def load_search(lab: Lab, name: str = SEARCH_RESULTS) -> Any:
    """The instructor's search for this engine's model and GPU (its provenance printed), or None with the one
    sentence that says how to get it (the results file is missing or measured elsewhere)."""
    try:
        rows, _ = load_results(name, lab.model, lab.settings.gpu)
    except ResultsError as err:
        print(f"The search did not run (RUN_GO_DEEPER is False): {err}")
        return None
    return rows


def search_conclusion(search: Any, ran_here: bool) -> Conclusion:
    """One line on Go deeper's search: which candidates it kept, from this run or from the instructor's file."""
    if search is None:
        return Conclusion("Go deeper's search over more candidates did not run here and no results file of it was "
                          "found: the lines above cover the core path's candidates only.")
    steps = search[search["kept"].notna()] if "kept" in search else search.iloc[0:0]
    kept = [str(c) for c in steps[steps["kept"] == True]["change"]]  # noqa: E712
    source = "this run" if ran_here else "the instructor's results file (its provenance printed above)"
    return Conclusion(f"Every candidate, the core path's and Go deeper's search, from {source}: {len(kept)} of "
                      f"{len(steps)} changes kept" + (f" ({'; '.join(kept)})." if kept else "."))


# ---------------------------------------------------------------- write it yourself: the SLO half of the rule

SLO_HINT = ("the SLO holds when the candidate's p90 TTFT is at most slo_x times the baseline's: one comparison, "
            "and at exactly slo_x times it still holds.")
_SLO_CASES = ((100.0, 100.0, 1.5), (150.0, 100.0, 1.5), (151.0, 100.0, 1.5), (140.0, 100.0, 1.2), (240.0, 100.0, 2.5),
              (90.0, 100.0, 1.0))


def _slo_reference(candidate_ms: float, baseline_ms: float, slo_x: float) -> bool:
    """The rule's own SLO test (``relative_rule`` then ``decide``), on plain numbers."""
    rule = relative_rule({"p90": baseline_ms, "tok_s": 1.0}, "tok_s", "p90", slo_x=slo_x)
    return not any("SLO" in r for r in decide({"tok_s": 1.0}, {"tok_s": 1.0, "p90": candidate_ms}, rule).reasons)


def slo_check_problem(answer: Any) -> str | None:
    """None when ``answer(candidate_ms, baseline_ms, slo_x)`` says what the rule says on every case, else what is
    wrong (the first case it gets wrong)."""
    if not callable(answer):
        return f"my_slo_holds should be a function of (candidate_ms, baseline_ms, slo_x), not {type(answer).__name__}."
    for candidate, baseline, x in _SLO_CASES:
        try:
            got = answer(candidate, baseline, x)
        except Exception as err:  # the learner's code: say what broke
            return f"my_slo_holds({candidate:g}, {baseline:g}, {x:g}) raised {type(err).__name__}: {err}."
        want = _slo_reference(candidate, baseline, x)
        if not isinstance(got, bool) and type(got).__name__ != "bool_":  # numpy's bool too
            return f"my_slo_holds({candidate:g}, {baseline:g}, {x:g}) returned {got!r}: return True or False."
        if bool(got) != want:
            return (f"a p90 TTFT of {candidate:g} ms against a baseline of {baseline:g} ms with slo_x={x:g} "
                    f"{'holds' if want else 'breaks'} the SLO (limit {x * baseline:g} ms), but yours says {bool(got)}.")
    return None


def slo_on_this_run(scorecard: Any, rule: Rule) -> str:
    """The SLO on this run's steps, as the rule saw them: the limit and each step's p90 TTFT, held or broken."""
    if rule.latency is None or rule.max_latency_ms is None:
        return "This run has no latency SLO (the baseline had no p90 TTFT)."
    def verdict(value: Any) -> str:
        if value is None or value != value:
            return "no measurement (the engine refused it)"
        return f"{value:,.0f} ms, {'holds' if value <= rule.max_latency_ms else 'breaks'}"

    shown = "; ".join(f"{r['change']}: {verdict(r.get(rule.latency))}" for _, r in scorecard.iloc[1:].iterrows())
    shown = shown or "no candidate measured"
    return f"On this run the limit is {rule.max_latency_ms:,.0f} ms ({rule.slo_x:g}x the baseline's): {shown}."


def kv_capacity_check(scorecard: Any, flag: str) -> tuple[bool | None, str]:
    """Whether the step that changed ``flag`` (the memory knob) reported a different KV capacity than the
    baseline: (seen, the numbers); None when the flag was not tried or the engine refused it."""
    base = scorecard.iloc[0].get("kv_capacity_tokens")
    steps = scorecard[scorecard["change"].astype(str).str.startswith(flag + " ")]
    if steps.empty or "kv_capacity_tokens" not in steps or steps["kv_capacity_tokens"].isna().all() or not base:
        return None, f"{flag} was not measured in this run (not a candidate, or the engine refused it)"
    kv = steps["kv_capacity_tokens"].dropna().iloc[0]
    return bool(kv != base), f"KV capacity {base:,.0f} tokens at the baseline, {kv:,.0f} with {steps.iloc[0]['change']}"


def hypothetical_row(row: dict[str, Any], rule: Rule, speed_x: float = 1.0, latency_x: float = 1.0) -> dict[str, Any]:
    """``row`` with its speed scaled by ``speed_x`` and its latency by ``latency_x`` (repeats included):
    a candidate to try the rule on without a restart."""
    out = dict(row)
    for column, x in ((rule.speed, speed_x), (rule.latency, latency_x)):
        if column and out.get(column) is not None:
            out[column] = out[column] * x
            if isinstance(out.get(f"{column}_runs"), (list, tuple)):
                out[f"{column}_runs"] = [v * x for v in out[f"{column}_runs"]]
    return out


def rule_outcome(baseline: dict[str, Any], rule: Rule, speed_x: float = 1.0, latency_x: float = 1.0) -> tuple[str, str]:
    """("kept" | "rolled back", the rule's reasons) for a candidate ``speed_x`` times as fast as ``baseline``
    with ``latency_x`` times its latency and the same eval."""
    decision = decide(baseline, hypothetical_row(baseline, rule, speed_x, latency_x), rule)
    reasons = "; ".join(decision.reasons)
    if decision.keep:
        return "kept", f"every part of the rule holds: {reasons}"
    if any("SLO" in r for r in decision.reasons):
        return "rolled back", f"a broken SLO rolls the change back, whatever it gains: {reasons}"
    return "rolled back", f"a gain inside the noise margin counts as no gain: {reasons}"


def scorecard_view(scorecard: Any, top: int) -> Any:
    """The scorecard's columns a reader compares (step, change, decision, KV, speed, latency, eval), rounded."""
    columns = ["step", "change", "kept", "why", "kv_capacity_tokens", "c1_mean_tpot_ms", f"c{top}_output_tok_s",
               f"c{top}_p90_ttft_ms", "all_pass_rate"]
    return scorecard[[c for c in columns if c in scorecard]].round(2)


# ---------------------------------------------------------------- structured output (section 5)

def structured_validity(frame: Any) -> Conclusion:
    """Did the JSON schema make more answers valid (the eval's parser: parses and matches the schema)? Paired by task
    on the first round (greedy answers repeat), exact McNemar on the tasks that flipped."""
    from helpers.evals.suite import mcnemar_p

    first = frame[frame["round"] == frame["round"].min()].pivot(index="id", columns="mode", values="valid")
    n = len(first)
    schema, free = int(first[SCHEMA].sum()), int(first[FREE].sum())
    gained = int((first[SCHEMA] & ~first[FREE]).sum())
    lost = int((~first[SCHEMA] & first[FREE]).sum())
    p = mcnemar_p(lost, gained) if gained + lost else 1.0
    text = (f"valid JSON of the schema: {schema}/{n} answers with the schema, {free}/{n} without "
            f"({gained} task(s) became valid, {lost} became invalid; McNemar p = {p:.3g})")
    expectation = "a JSON schema makes the answers valid"
    if p < 0.05 and gained > lost:
        return Conclusion(text + ": the grammar made the difference.", SHOWN, expectation)
    if p < 0.05:
        return Conclusion(text + ": the schema made answers worse, beyond noise; read the outputs.", NOT_SHOWN,
                          expectation)
    why = (" Without the schema the model already answers valid JSON here, so there was little to fix." if free == n
           else "")
    return Conclusion(text + ": no difference beyond noise." + why, WITHIN_NOISE, expectation)


def structured_tpot(frame: Any) -> Conclusion:
    """What the grammar costs per output token: per-round median TPOT with and without the schema, judged against
    the rounds' spread (``compare_samples``)."""
    from helpers.evals.structured import round_medians

    medians = round_medians(frame)
    verdict = compare_samples(medians[FREE], medians[SCHEMA], higher_is_better=False)
    spread = (f"{min(medians[SCHEMA]):.2f}-{max(medians[SCHEMA]):.2f} ms with the schema, "
              f"{min(medians[FREE]):.2f}-{max(medians[FREE]):.2f} ms without, over {len(medians[SCHEMA])} round(s)")
    expectation = "the grammar costs time per output token"
    if verdict.label == UNKNOWN:
        return Conclusion("time per output token: no answer of two or more tokens on one side, nothing to compare.",
                          "", expectation)
    head = f"time per output token {verdict.mean_b:.2f} ms with the schema vs {verdict.mean_a:.2f} ms without"
    if verdict.label == WORSE:
        return Conclusion(f"{head} ({verdict.ratio - 1:+.0%}; per-round medians {spread}): the token mask costs "
                          f"about {verdict.mean_b - verdict.mean_a:.2f} ms per step here, beyond the rounds' spread. "
                          "Its share depends on how long a step is: beside the tiny model's short step it weighs more "
                          "than beside the longer step of a large model.", SHOWN, expectation)
    if verdict.label == BETTER:
        return Conclusion(f"{head} ({verdict.ratio - 1:+.0%}; {spread}): faster with the schema, beyond the spread: "
                          "not a cost of the grammar, likely the machine drifting between rounds.", NOT_SHOWN,
                          expectation)
    return Conclusion(f"{head} ({verdict.ratio - 1:+.0%}; {spread}): no measurable cost, within the rounds' spread "
                      f"(+/-{verdict.noise_rel:.0%}).", WITHIN_NOISE, expectation)
