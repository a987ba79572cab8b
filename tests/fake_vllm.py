"""A tiny in-process stand-in for vLLM's OpenAI server, for the load-generator tests.

It speaks just enough HTTP/1.1 (one request per connection, chunked SSE) to stream chat completions
the way vLLM does with ``stream_options={"include_usage": true, "continuous_usage_stats": true}``:
a role-only first chunk, token chunks carrying ``chunk_pattern`` tokens each with a running usage,
the finish reason on the last token chunk, a usage-only chunk with empty ``choices``, then
``data: [DONE]``. It also answers ``/tokenize`` (a fake tokenizer: one token per whitespace-separated
piece, two for pieces longer than five characters; a chat costs 4 tokens per message + 3), ``/v1/models``
and ``/metrics``. Faults on demand: drop every n-th stream mid-way, die after n requests.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

MODEL = "fake-model"
PER_MESSAGE_TOKENS = 4
GENERATION_PROMPT_TOKENS = 3


def fake_tokens(text: str) -> int:
    return sum(2 if len(piece) > 5 else 1 for piece in text.split())


def chat_tokens(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> int:
    body = sum(PER_MESSAGE_TOKENS + fake_tokens(m.get("content") or "") for m in messages)
    return body + (GENERATION_PROMPT_TOKENS if add_generation_prompt else 0)


class FakeVllm:
    """Start with ``start()``, point a client at ``base_url``, stop with ``stop()``."""

    def __init__(self, ttft_s: float = 0.005, chunk_gap_s: float = 0.002, chunk_pattern: tuple[int, ...] = (1,),
                 reasoning_tokens: int = 0, drop_every: int | None = None, drop_after_chunks: int = 2,
                 die_after: int | None = None, tokenize: bool = True, metrics_text: str | None = None,
                 continuous_usage: bool = True) -> None:
        self.ttft_s = ttft_s
        self.chunk_gap_s = chunk_gap_s
        self.chunk_pattern = chunk_pattern
        self.reasoning_tokens = reasoning_tokens
        self.drop_every = drop_every
        self.drop_after_chunks = drop_after_chunks
        self.die_after = die_after
        self.tokenize = tokenize
        self.metrics_text = metrics_text
        self.continuous_usage = continuous_usage  # False: usage only in the last, choice-less chunk
        self.chat_payloads: list[dict[str, Any]] = []
        self.chat_headers: list[dict[str, str]] = []  # each chat request's headers (lower-case names), in order
        self.completion_payloads: list[dict[str, Any]] = []
        # what /v1/completions answers, one status per request (the last one repeats): 500 plays a server
        # that starts but cannot generate
        self.completion_statuses: list[int] = [200]
        self.tokenize_calls = 0
        self.inflight = 0
        self.max_inflight = 0
        self.finished = 0
        self.dead = False
        self.port = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- lifecycle
    def start(self) -> "FakeVllm":
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()
            self._loop.close()

        self._thread = threading.Thread(target=run, name="fake-vllm", daemon=True)
        self._thread.start()
        ready.wait(5)
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _shutdown(self) -> None:
        self._die()
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _die(self) -> None:
        self.dead = True
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()

    # -- HTTP
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            line = await reader.readline()
            if not line:
                return
            method, path, _ = line.decode().split(" ", 2)
            headers: dict[str, str] = {}
            while True:
                h = await reader.readline()
                if h in (b"\r\n", b"\n", b""):
                    break
                key, value = h.decode().split(":", 1)
                headers[key.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
            payload = json.loads(body) if body else {}
            if path == "/v1/models":
                await self._json(writer, 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            elif path == "/tokenize" and method == "POST":
                await self._tokenize(writer, payload)
            elif path == "/metrics" and self.metrics_text is not None:
                await self._send(writer, 200, self.metrics_text.encode(), "text/plain; version=0.0.4")
            elif path == "/v1/completions" and method == "POST":  # the engines' one-token readiness check
                self.completion_payloads.append(payload)
                status = self.completion_statuses.pop(0) if len(self.completion_statuses) > 1 else self.completion_statuses[0]
                body = ({"choices": [{"index": 0, "text": " hi", "finish_reason": "length"}]}
                        if status == 200 else {"error": {"message": "EngineCore encountered an issue."}})
                await self._json(writer, status, body)
            elif path == "/v1/chat/completions" and method == "POST":
                self.chat_headers.append(headers)
                await self._chat(writer, payload)
            else:
                await self._json(writer, 404, {"detail": "Not Found"})
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _send(self, writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str) -> None:
        head = (f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        writer.write(head.encode() + body)
        await writer.drain()

    async def _json(self, writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
        await self._send(writer, status, json.dumps(obj).encode(), "application/json")

    async def _tokenize(self, writer: asyncio.StreamWriter, payload: dict[str, Any]) -> None:
        self.tokenize_calls += 1
        if not self.tokenize:
            await self._json(writer, 404, {"detail": "Not Found"})
            return
        if "messages" in payload:
            count = chat_tokens(payload["messages"], payload.get("add_generation_prompt", True))
        else:
            count = fake_tokens(payload["prompt"]) + (1 if payload.get("add_special_tokens", True) else 0)
        await self._json(writer, 200, {"count": count, "max_model_len": 4096, "tokens": list(range(count))})

    async def _chat(self, writer: asyncio.StreamWriter, payload: dict[str, Any]) -> None:
        number = len(self.chat_payloads)
        self.chat_payloads.append(payload)
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            await self._stream(writer, payload, number)
        finally:
            self.inflight -= 1
        self.finished += 1
        if self.die_after is not None and self.finished >= self.die_after and not self.dead:
            self._die()

    async def _stream(self, writer: asyncio.StreamWriter, payload: dict[str, Any], number: int) -> None:
        prompt = chat_tokens(payload["messages"])
        n_out = payload.get("min_tokens") or payload.get("max_tokens") or 16
        created = int(time.time())

        def usage(done: int) -> dict[str, int] | None:
            return {"prompt_tokens": prompt, "total_tokens": prompt + done, "completion_tokens": done}

        def chunk(delta: dict[str, Any], finish: str | None, done: int) -> dict[str, Any]:
            return {"id": f"chatcmpl-{number}", "object": "chat.completion.chunk", "created": created, "model": MODEL,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                    "usage": usage(done) if self.continuous_usage else None}

        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                     b"Connection: close\r\n\r\n")

        async def event(obj: Any) -> None:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()

        await event(chunk({"role": "assistant", "content": ""}, None, 0))
        await asyncio.sleep(self.ttft_s)
        done, sent_chunks, i = 0, 0, 0
        dropping = self.drop_every is not None and (number + 1) % self.drop_every == 0
        while done < n_out:
            k = min(self.chunk_pattern[i % len(self.chunk_pattern)], n_out - done)
            i += 1
            text = "tok " * k
            delta = {"reasoning": text} if done < self.reasoning_tokens else {"content": text}
            done += k
            await event(chunk(delta, "length" if done >= n_out else None, done))
            sent_chunks += 1
            if dropping and sent_chunks >= self.drop_after_chunks:
                writer.transport.abort()  # the connection dies mid-stream
                return
            await asyncio.sleep(self.chunk_gap_s)
        final = {"id": f"chatcmpl-{number}", "object": "chat.completion.chunk", "created": created, "model": MODEL,
                 "choices": [], "usage": usage(done)}
        await event(final)
        await event(b"[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def serve_json(status: int, body: dict[str, Any]) -> HTTPServer:
    """A tiny server that answers every GET with ``status`` and ``body`` (stop it with ``shutdown()``)."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
