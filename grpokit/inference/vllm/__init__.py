"""vLLM as grpokit's engine: the VLLMEngine client, starting and stopping vLLM's server, the worker
extension that receives weights over NCCL, and the memory estimate for sharing the trainer's GPU."""

from grpokit.inference.vllm.engine import VLLMEngine

__all__ = ["VLLMEngine"]  # the class path grpokit.inference.vllm.VLLMEngine in older config.yaml files
