"""Notebook 03, prefill, decode and the KV cache: attention by hand, the generation loop, prefill against
decode, the KV cache on the live engine, and a long prefill stalling running decodes."""
