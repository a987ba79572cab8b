"""Download every model the labs switch to into the Hugging Face cache on the model volume, or wait for it.

``python3 predownload.py``: the download. Runs once per workshop as the Job ``model-download`` in the
instructor's namespace (k8s/models), or as the engine's initContainer in a single demo namespace
(k8s/components/self-download); image vllm/vllm-openai, which ships huggingface_hub. Models come from
PREDOWNLOAD_MODELS and PREDOWNLOAD_EXTRA_MODELS (separated by spaces or commas); the cache is HF_HOME. Models
already complete in the cache take seconds. When every model is in, it writes READY_FILE (the models it
holds, one per line). Exits non-zero when a model cannot be downloaded (the Job retries with back-off).

``python3 predownload.py --wait``: the engine's initContainer in a participant's namespace, where the volume is
mounted read-only and nothing is downloaded: it returns once READY_FILE lists every model it needs, and says
every WAIT_REPORT_S seconds what it is still waiting for (``kubectl logs <pod> -c wait-for-models``).
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Callable, Mapping

# Weights in other formats that vLLM does not load when safetensors are present.
IGNORE_PATTERNS = ["original/*", "*.pth", "*.pt", "*.gguf", "*.onnx", "*.msgpack", "*.h5"]
ATTEMPTS = 3
READY_FILE = "workshop-models-ready.txt"  # in HF_HOME, written last
WAIT_POLL_S = 10.0
WAIT_REPORT_S = 60.0


def parse_models(*values: str) -> list[str]:
    """Model ids from space- or comma-separated lists, first occurrence order, no duplicates."""
    models: list[str] = []
    for value in values:
        for name in re.split(r"[\s,]+", value or ""):
            if name and name not in models:
                models.append(name)
    return models


def download_all(models: list[str], download: Callable[..., str], sleep_s: float = 10.0) -> list[str]:
    """Download each model (up to ATTEMPTS tries); return the local snapshot paths."""
    paths = []
    for number, model in enumerate(models, start=1):
        for attempt in range(1, ATTEMPTS + 1):
            start = time.monotonic()
            print(f"[predownload] model {number}/{len(models)}: {model} (attempt {attempt})", flush=True)
            try:
                path = download(repo_id=model, ignore_patterns=IGNORE_PATTERNS)
            except Exception as err:  # network errors come in many types; report and retry
                print(f"[predownload] {model}: attempt {attempt} failed: {err}", flush=True)
                if attempt == ATTEMPTS:
                    raise
                time.sleep(sleep_s * attempt)
                continue
            print(f"[predownload] model {number}/{len(models)}: {model} ready in "
                  f"{time.monotonic() - start:.0f} s at {path}", flush=True)
            paths.append(path)
            break
    return paths


def ready_models(home: str) -> list[str]:
    """The models READY_FILE under ``home`` lists (none when it is absent)."""
    path = Path(home) / READY_FILE
    return parse_models(path.read_text()) if path.is_file() else []


def write_ready(home: str, models: list[str]) -> None:
    """Record that ``models`` are complete (written to a temporary name first, then renamed)."""
    path = Path(home) / READY_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{m}\n" for m in sorted(set(models) | set(ready_models(home)))))
    tmp.replace(path)


def wait_for(home: str, models: list[str], sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> None:
    """Return once READY_FILE under ``home`` lists every model; say what is missing every WAIT_REPORT_S."""
    last_report = None
    while True:
        missing = [m for m in models if m not in ready_models(home)]
        if not missing:
            print(f"[wait-for-models] all {len(models)} models are in the shared cache", flush=True)
            return
        if last_report is None or clock() - last_report >= WAIT_REPORT_S:
            print(f"[wait-for-models] waiting for the room's download (Job model-download in the instructor's "
                  f"namespace): {len(models) - len(missing)}/{len(models)} models in, missing {', '.join(missing)}",
                  flush=True)
            last_report = clock()
        sleep(WAIT_POLL_S)


def main(env: Mapping[str, str] | None = None, download: Callable[..., str] | None = None,
         argv: list[str] | None = None) -> int:
    """Download the models named in the environment (or, with --wait, wait for them); 0 on success."""
    env = os.environ if env is None else env
    argv = sys.argv[1:] if argv is None else argv
    models = parse_models(env.get("PREDOWNLOAD_MODELS", ""), env.get("PREDOWNLOAD_EXTRA_MODELS", ""))
    home = env.get("HF_HOME", "/models/hf")
    if "--wait" in argv:
        wait_for(home, models)
        return 0
    if not models:
        print("[predownload] PREDOWNLOAD_MODELS is empty: nothing to do", flush=True)
        return 0
    if download is None:
        from huggingface_hub import snapshot_download

        download = snapshot_download
    print(f"[predownload] cache {home}: {', '.join(models)}", flush=True)
    try:
        download_all(models, download)
    except Exception as err:
        print(f"[predownload] giving up: {err}", file=sys.stderr, flush=True)
        return 1
    Path(home).mkdir(parents=True, exist_ok=True)
    write_ready(home, models)
    print(f"[predownload] done: {len(models)} models listed in {READY_FILE}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
