"""`grpokit bench`: grpokit's path and the naive baseline on the same model and shapes, in one process.

`generate` (builtin engine fast path vs Hugging Face `generate`), `train` (grpokit's trainer path vs a
naive LoRA step), `step` (a whole GRPO step with max_async_level 1 vs its parts), `multiturn` (the
builtin engine's prefix KV cache on vs off, turn by turn), `stream` (whole-batch vs streaming generation
on long-tailed lengths), `server` (`grpokit infer` under 1/8/32 clients vs an older tree's server), each
printing tokens/s or seconds, time per step, peak memory, the ratio and, for generate, a memory-roofline
estimate. `--model` takes a config shape (random weights, no hub) or a model name.
"""
