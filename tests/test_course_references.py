"""The glossary and the cheat sheet beside the notebooks: terms defined once, flags vLLM knows, links to its docs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest

from helpers.lab import workspace

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
GLOSSARY = (NOTEBOOKS / "glossary.md").read_text()
CHEATSHEET = (NOTEBOOKS / "cheatsheet.md").read_text()
# the terms the notebooks used before explaining them (issue 27), and the ones every lesson rests on
REQUIRED_TERMS = ("SLO", "Goodput", "MBU", "ITL", "HBM", "Ridge point", "McNemar's test", "G-test", "Power", "EAGLE",
                  "MTP", "Medusa", "NUMA", "GQA", "TTFT", "TPOT", "KV cache", "Prefill", "Decode", "PagedAttention",
                  "Continuous batching", "Chunked prefill", "Prefix caching", "Preemption", "Roofline", "MoE",
                  "Speculative decoding", "Acceptance rate (a)", "Permutation test", "Reasoning (thinking)")


def _defined_terms(text: str) -> list[str]:
    """Each glossary entry's term: the bold words that open a bullet."""
    return re.findall(r"^- \*\*(.+?)\*\*", text, re.M)


def test_the_glossary_defines_every_required_term_exactly_once():
    terms = _defined_terms(GLOSSARY)
    missing = [t for t in REQUIRED_TERMS if t not in terms]
    assert not missing, f"define these in notebooks/glossary.md: {missing}"
    doubled = sorted({t for t in terms if terms.count(t) > 1})
    assert not doubled, f"defined more than once: {doubled}"


def test_every_glossary_entry_names_the_notebook_where_it_matters_or_none():
    for line in GLOSSARY.splitlines():
        if line.startswith("- **"):
            for number in re.findall(r"\[(\d\d)\]", line):
                assert list(NOTEBOOKS.glob(f"{number}_*.ipynb")), f"{line[:60]}... names no notebook {number}"


def test_continuous_batching_is_credited_to_orca_not_to_pagedattention():
    entry = next(line for line in GLOSSARY.splitlines() if line.startswith("- **Continuous batching**"))
    following = GLOSSARY.split(entry, 1)[1].split("\n- ", 1)[0]
    assert "Orca" in entry + following and "OSDI 2022" in entry + following


def _table_rows(text: str) -> list[list[str]]:
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| Symptom")]
    return [row for row in rows if not set("".join(row)) <= set("-: ")]


def _cluster_vllm_version() -> str:
    gpu = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    return next(req.split("==")[1] for req in gpu if req.startswith("vllm=="))


def test_every_cheat_sheet_row_links_to_vllms_docs_for_the_clusters_version():
    rows = _table_rows(CHEATSHEET)
    assert len(rows) >= 8
    version = _cluster_vllm_version()
    for row in rows:
        links = re.findall(r"\]\((https://docs\.vllm\.ai/[^)]+)\)", row[3])
        assert links, f"no link to vLLM's docs in the row {row[0]!r}"
        assert all(f"/en/v{version}/" in link for link in links), (row[0], links, version)
        assert re.search(r"\d\d", row[4]), f"row {row[0]!r} names no notebook"


def _cheat_sheet_flags() -> list[str]:
    return sorted({flag for row in _table_rows(CHEATSHEET) for flag in re.findall(r"`(--[a-z][a-z-]+)", row[2])})


def test_every_flag_in_the_cheat_sheet_is_one_the_installed_vllm_knows():
    flags = _cheat_sheet_flags()
    assert "--max-num-seqs" in flags and "--kv-cache-dtype" in flags
    code = ("import json, sys\n"
            "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
            "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
            "parser = make_arg_parser(FlexibleArgumentParser())\n"
            "known = {o for a in parser._actions for o in a.option_strings}\n"
            "print(json.dumps(sorted(f for f in json.load(sys.stdin) if f not in known)))\n")
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(flags), capture_output=True, text=True,
                          timeout=180)
    if "ModuleNotFoundError" in proc.stderr:  # the client profile has no vLLM: the cpu and gpu profiles check it
        pytest.skip("vLLM is not installed here: " + proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr[-2000:]
    unknown = json.loads(proc.stdout.strip().splitlines()[-1])
    assert unknown == [], f"flags the installed vLLM does not know: {unknown}"


def test_the_metrics_named_are_vllms_own():
    metrics = set(re.findall(r"`(vllm:[a-z_]+)", CHEATSHEET))
    assert metrics and all(re.fullmatch(r"vllm:[a-z][a-z_]*[a-z]", m) for m in metrics)
    from helpers.measure import server_metrics

    known = {name for table in (server_metrics.GAUGES, server_metrics.COUNTERS) for names in table.values()
             for name in names} | set(server_metrics.CACHE_CONFIG)
    # a counter's Prometheus name carries _total; the scraper knows it by its family name
    unknown = sorted(m for m in metrics if m.removesuffix("_total") not in known and m not in known)
    assert not unknown, f"metrics the kit's scraper does not read: {unknown}"


def test_start_here_links_both_pages_and_the_links_resolve():
    text = "".join(c.source for c in nbformat.read(NOTEBOOKS / "start_here.ipynb", as_version=4).cells
                   if c.cell_type == "markdown")
    for page in workspace.REFERENCE_PAGES:
        assert f"]({page})" in text, page
    for target in re.findall(r"\]\(([\w.-]+\.md)\)", GLOSSARY + CHEATSHEET):
        assert (NOTEBOOKS / target).is_file(), target


def test_a_workspace_gets_the_pages_beside_the_notebooks_and_keeps_the_learners_edits(tmp_path):
    ws = tmp_path / "ws"
    report = workspace.sync(ws)
    for page in workspace.REFERENCE_PAGES:
        assert (ws / page).read_text() == (NOTEBOOKS / page).read_text() and page in report.copied
    (ws / "glossary.md").write_text("my notes\n")
    again = workspace.sync(ws)
    assert "glossary.md" in again.kept and (ws / "glossary.md").read_text() == "my notes\n"
