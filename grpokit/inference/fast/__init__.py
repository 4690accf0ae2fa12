"""The builtin engine's fast path: static KV cache, CUDA-graph decode steps, continuous batching.

`runner.ModelRunner` drives a Hugging Face Llama-family model against a pre-allocated cache;
`continuous.generate_continuous` keeps its slots full from a queue of requests. On CPU the same code
runs without graphs (tests compare it with the plain sampler token for token).
"""
