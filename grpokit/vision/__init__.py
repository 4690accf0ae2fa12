"""Vision-language prompts: images in chat messages -> the token ids and tensors a VL model takes, and
the logprobs of completions to them, token-faithful between sampling and training (issue 36; the
rollout path uses it through grpokit.orchestrator.image_prompts, grpokit.inference.image_rows and
grpokit.common.logprobs; docs/vision.md says what is checked and what comes next).

- images.py: a path, bytes, a PIL image or a data: URL -> an RGB image within a pixel budget.
- messages.py: the image parts of a chat (any turn, several per prompt) -> processor-shaped messages
  and the images in order.
- inputs.py: VisionInputs, the model's image tensors by name; plain tensors + a string header, and
  the concatenation of several sequences' for a packed row.
- render.py: prompt ids and VisionInputs from the model's processor.
- positions.py: position ids of a packed row (the Qwen-VL family's 3-D ones from the model itself).
- logprobs.py: per-token logprobs of a packed row with images, and the completion-only loss mask.
- sample.py: a completion with per-token logprobs from the model's `generate`.

Every module imports only torch, transformers, PIL and grpokit.common (the "common" layer).
"""
