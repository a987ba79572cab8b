"""Download every model the labs switch to into the Hugging Face cache on the model volume.

Runs as the vLLM pod's initContainer (image vllm/vllm-openai, which ships huggingface_hub).
Models come from PREDOWNLOAD_MODELS and PREDOWNLOAD_EXTRA_MODELS (separated by spaces or
commas); the cache is HF_HOME. Models already complete in the cache take seconds. Exits non-zero
when a model cannot be downloaded, so the pod shows Init:Error and retries with back-off.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Callable, Mapping

# Weights in other formats that vLLM does not load when safetensors are present.
IGNORE_PATTERNS = ["original/*", "*.pth", "*.pt", "*.gguf", "*.onnx", "*.msgpack", "*.h5"]
ATTEMPTS = 3


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
    for model in models:
        for attempt in range(1, ATTEMPTS + 1):
            start = time.monotonic()
            try:
                path = download(repo_id=model, ignore_patterns=IGNORE_PATTERNS)
            except Exception as err:  # network errors come in many types; report and retry
                print(f"[predownload] {model}: attempt {attempt} failed: {err}", flush=True)
                if attempt == ATTEMPTS:
                    raise
                time.sleep(sleep_s * attempt)
                continue
            print(f"[predownload] {model}: ready in {time.monotonic() - start:.0f} s at {path}", flush=True)
            paths.append(path)
            break
    return paths


def main(env: Mapping[str, str] | None = None, download: Callable[..., str] | None = None) -> int:
    """Download the models named in the environment; 0 on success."""
    env = os.environ if env is None else env
    models = parse_models(env.get("PREDOWNLOAD_MODELS", ""), env.get("PREDOWNLOAD_EXTRA_MODELS", ""))
    if not models:
        print("[predownload] PREDOWNLOAD_MODELS is empty: nothing to do", flush=True)
        return 0
    if download is None:
        from huggingface_hub import snapshot_download

        download = snapshot_download
    print(f"[predownload] cache {env.get('HF_HOME', '(default)')}: {', '.join(models)}", flush=True)
    try:
        download_all(models, download)
    except Exception as err:
        print(f"[predownload] giving up: {err}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
