"""Notebook 02's code exercise: the KV cache's bytes per token, written by the attendee from config.json's fields, and
the check that says which factor is missing or wrong (the query heads for the KV heads, K without V, numbers for
bytes, FP32 for BF16, one layer for all).

``kv_bytes_check(layers, query_heads, kv_heads, head_dim)`` returns the check ``check_exercise`` calls with the
attendee's answer; ``KV_BYTES_HINT`` is the exercise's hint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

KV_BYTES_HINT = ("every layer keeps, for each token, one key and one value vector per KV head, each head_dim numbers "
                 "of 2 bytes (BF16): multiply those five factors")


def kv_bytes_check(layers: int, query_heads: int, kv_heads: int, head_dim: int,
                   bytes_per_element: int = 2) -> Callable[[Any], str | None]:
    """The check of an attendee's KV bytes per token for a model of this shape: None when it is
    2 x ``layers`` x ``kv_heads`` x ``head_dim`` x ``bytes_per_element``, else the sentence naming the likely slip."""
    right = 2 * layers * kv_heads * head_dim * bytes_per_element
    slips = [
        (2 * layers * query_heads * head_dim * bytes_per_element,
         f"that uses the {query_heads} query heads: with grouped-query attention only the {kv_heads} KV heads are "
         "cached (num_key_value_heads)."),
        (right // 2, "that is half: a key and a value are cached for each head (x 2)."),
        (2 * layers * kv_heads * head_dim, f"that counts numbers, not bytes: each is {bytes_per_element} bytes in BF16."),
        (2 * layers * kv_heads * head_dim * 4, "4 bytes per number is FP32; the cache is BF16 here, 2 bytes."),
        (2 * kv_heads * head_dim * bytes_per_element,
         f"that is one layer's worth: each of the {layers} layers keeps its own keys and values."),
    ]

    def check(answer: Any) -> str | None:
        if isinstance(answer, bool) or not isinstance(answer, (int, float)):
            return f"kv_bytes_by_hand must be a number of bytes, not {type(answer).__name__}."
        if answer == right:
            return None
        reasons = [why for value, why in slips if value != right and answer == value]
        if reasons:  # in BF16 a missing V and a missing byte count give the same number: both are said
            return " Or ".join(reasons)
        return (f"{answer:,} bytes per token is not it: multiply K and V (2), the layers, the KV heads, head_dim and "
                "the bytes per number.")

    return check
