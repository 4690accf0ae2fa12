"""Contract checks for components, shipped so plugin authors can run them on their own classes.

    from grpokit.testing import check_component
    check_component(MyLoss)          # raises AssertionError naming the broken rule

tests/test_contracts.py runs them over every registered subclass (built-ins and installed plugins).
Components are built with their defaults: every argument of a component needs a default.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from abc import abstractmethod

import torch

from grpokit.advantage import Advantage
from grpokit.filter import Filter
from grpokit.inference import InferenceEngine
from grpokit.loss import Loss, LossInputs
from grpokit.noise import NoiseScheduler
from grpokit.types import MicroBatch, Rollout, TrainingBatch


def check_component(cls: type) -> None:
    """Run the contract checks of `cls`'s kind (loss, advantage, filter or noise); other kinds are skipped."""
    for base, check in (
        (Loss, check_loss),
        (Advantage, check_advantage),
        (Filter, check_filter),
        (NoiseScheduler, check_noise_scheduler),
    ):
        if issubclass(cls, base):
            check(cls())


def make_loss_inputs(trainer, infer, adv, seq_ids=None, mask=None, **overrides) -> LossInputs:
    """float64 LossInputs from plain lists, for hand-computed tests; trainer logprobs require grad.

    seq_ids defaults to one sequence; loss_normalizer and step_num_seqs default to this micro-batch's
    loss tokens and sequences with loss tokens (as if it were the whole step); `overrides` replace any field.
    """
    seq_ids = list(seq_ids) if seq_ids is not None else [0] * len(trainer)
    mask_t = torch.tensor(mask if mask is not None else [1] * len(trainer), dtype=torch.float64)
    seq_ids_t = torch.tensor(seq_ids)
    with_loss = torch.zeros(max(seq_ids) + 1, dtype=torch.float64).index_add(0, seq_ids_t, mask_t) > 0
    fields = {
        "trainer_logprobs_T": torch.tensor(trainer, dtype=torch.float64, requires_grad=True),
        "inference_logprobs_T": torch.tensor(infer, dtype=torch.float64),
        "advantages_T": torch.tensor(adv, dtype=torch.float64),
        "loss_mask_T": mask_t,
        "seq_ids_T": seq_ids_t,
        "num_seqs": max(seq_ids) + 1,
        "loss_normalizer": float(mask_t.sum().clamp(min=1)),
        "step_num_seqs": max(int(with_loss.sum()), 1),
    }
    return LossInputs(**{**fields, **overrides})


def loss_and_grad(loss_fn: Loss, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[float]]:
    """Run the loss, backpropagate, and return (loss, metrics, d loss / d trainer_logprobs as a list)."""
    loss, metrics = loss_fn(inputs)
    loss.backward()
    return loss, metrics, inputs.trainer_logprobs_T.grad.tolist()


def loss_inputs(trainer_T, inference_T, adv_T, mask_T, seq_ids_T, ref_T=None) -> LossInputs:
    return LossInputs(
        trainer_logprobs_T=trainer_T,
        inference_logprobs_T=inference_T,
        advantages_T=adv_T,
        loss_mask_T=mask_T,
        seq_ids_T=seq_ids_T,
        num_seqs=int(seq_ids_T.max()) + 1 if len(seq_ids_T) else 0,
        loss_normalizer=float(max(mask_T.sum().item(), 1)),
        step_num_seqs=max(int(seq_ids_T.max()) + 1 if len(seq_ids_T) else 1, 1),
        is_truncated_N=torch.zeros(int(seq_ids_T.max()) + 1 if len(seq_ids_T) else 0, dtype=torch.bool),
        ref_logprobs_T=ref_T,
    )


def check_loss(loss: Loss) -> None:
    """0-dim finite loss, 0-dim detached metrics, gradient on trainer logprobs, no NaN on edge inputs."""
    name = type(loss).__name__
    g = torch.Generator().manual_seed(0)
    cases = {
        "random": (12, torch.tensor([0] * 5 + [1] * 4 + [2] * 3), torch.ones(12)),
        "on-policy": (12, torch.tensor([0] * 5 + [1] * 4 + [2] * 3), torch.ones(12)),
        "single token": (1, torch.tensor([0]), torch.ones(1)),
        "all masked": (6, torch.tensor([0, 0, 0, 1, 1, 1]), torch.zeros(6)),
        "prompt tokens masked": (6, torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([0.0, 1, 1, 0, 1, 1])),
    }
    for case, (t, seq_ids, mask) in cases.items():
        mask = mask.double()
        # a loss that trains on expert sequences gets the last sequence's loss tokens as expert tokens
        expert = ((seq_ids == seq_ids.max()) & (mask > 0)).double() if loss.needs_experts else torch.zeros_like(mask)
        mask = mask * (1 - expert)
        trainer = (-torch.rand(t, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
        noise = 0.0 if case == "on-policy" else 0.05
        inference = trainer.detach() + noise * torch.randn(t, generator=g, dtype=torch.float64)
        adv = torch.randn(int(seq_ids.max()) + 1, generator=g, dtype=torch.float64)[seq_ids]
        ref = trainer.detach() - 0.1 if loss.needs_reference else None
        inputs = loss_inputs(trainer, inference, adv, mask, seq_ids, ref)
        if loss.needs_entropy:
            inputs.entropy_T = torch.rand(t, generator=g, dtype=torch.float64) * mask
        if loss.needs_teacher:
            inputs.teacher_logprobs_T = trainer.detach() + 0.2 * torch.randn(t, generator=g, dtype=torch.float64)
        if loss.needs_experts:
            inputs.expert_mask_T, inputs.expert_normalizer = expert, float(max(expert.sum().item(), 1))
        out, metrics = loss(inputs)
        assert out.dim() == 0 and torch.isfinite(out), f"{name} ({case}): loss must be a finite 0-dim tensor, got {out}"
        for key, value in metrics.items():
            assert torch.is_tensor(value) and value.dim() == 0 and not value.requires_grad, (
                f"{name} ({case}): metric {key} must be a detached 0-dim tensor"
            )
            assert torch.isfinite(value), f"{name} ({case}): metric {key} is {value}"
        out.backward()
        grad = trainer.grad
        assert grad is not None and torch.all(torch.isfinite(grad)), (
            f"{name} ({case}): gradient must reach trainer_logprobs_T and be finite"
        )
        assert torch.all(grad[(mask == 0) & (expert == 0)] == 0), (
            f"{name} ({case}): tokens outside the loss (and expert) mask must get zero gradient"
        )
        if case == "on-policy":  # off-policy tokens may all be clipped (GSPO's trust region is ~1e-4)
            assert grad.abs().sum() > 0, f"{name}: no gradient on on-policy tokens with non-zero advantages"


def check_advantage(advantage: Advantage) -> None:
    """Shape and dtype kept, finite, zero advantage for groups whose rewards are all equal; per token, each
    rollout's advantage on every completion token when its one step is the whole completion."""
    name = type(advantage).__name__
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(4, 6, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, 30, (4, 6), generator=g).double()
    out = advantage(rewards, lengths)
    assert out.shape == rewards.shape and out.dtype == rewards.dtype, (
        f"{name}: output must have the rewards' shape and dtype"
    )
    assert torch.all(torch.isfinite(out)), f"{name}: non-finite advantages"
    equal = torch.full((3, 5), 0.5, dtype=torch.float64)
    zeros = advantage(equal, torch.ones_like(equal))
    assert torch.all(zeros == 0), f"{name}: groups with equal rewards must get exactly zero advantage, got {zeros}"
    groups = [
        [
            Rollout(
                example_id=p,
                env_id="e",
                group_id=p,
                prompt_ids=[1],
                completion_ids=[7] * int(n),
                completion_logprobs=[-0.5] * int(n),
                completion_mask=[1] * int(n),
                reward=float(r),
                is_truncated=False,
                policy_step=0,
                step_rewards=[float(r)],
                step_ends=[int(n) - 1],
            )
            for r, n in zip(rewards[p], lengths[p])
        ]
        for p in range(len(rewards))
    ]
    per_token = advantage.token_advantages(groups)
    expected = [[a] * int(n) for a, n in zip(out.flatten().tolist(), lengths.flatten().tolist())]
    assert len(per_token) == len(expected) and all(
        len(got) == len(want) and all(abs(x - y) <= 1e-9 for x, y in zip(got, want))
        for got, want in zip(per_token, expected)
    ), (
        f"{name}: token_advantages must give each rollout's advantage "
        "on each completion token when its one step spans the completion"
    )
    assert advantage.token_advantages([]) == [], f"{name}: token_advantages([]) must be []"


class StubTokenizer:
    """The policy's tokenizer as check_filter gives it to `Filter.connect`: a vocabulary of `size` ids
    (len), each decoding to one letter."""

    def __init__(self, size: int = 1000) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(ord("a") + t % 26) for t in token_ids)


def check_filter(flt: Filter) -> None:
    """Once connected to a tokenizer, one bool per rollout; an empty list gives an empty list."""
    name = type(flt).__name__
    flt.connect(StubTokenizer())
    rollouts = [
        Rollout(
            example_id=i,
            env_id="e",
            group_id=0,
            prompt_ids=[1, 2],
            completion_ids=[3] * (i + 1),
            completion_logprobs=[-0.5] * (i + 1),
            completion_mask=[1] * (i + 1),
            reward=0.0,
            is_truncated=i % 2 == 1,
            policy_step=0,
        )
        for i in range(4)
    ]
    flags = flt.flag(rollouts)
    assert len(flags) == len(rollouts) and all(isinstance(f, bool) for f in flags), (
        f"{name}: flag() must return one bool per rollout"
    )
    assert flt.flag([]) == [], f"{name}: flag([]) must be []"


def check_noise_scheduler(scheduler: NoiseScheduler) -> None:
    """A finite sigma >= 0 for every step 0 .. max_steps (and past it), the same on every call (no state)."""
    name = type(scheduler).__name__
    for max_steps in (1, 7, 100):
        sigmas = [scheduler.sigma(step, max_steps) for step in range(max_steps + 2)]
        assert all(isinstance(s, float) and 0 <= s < float("inf") for s in sigmas), (
            f"{name}: sigma must be a finite float >= 0, got {sigmas}"
        )
        assert sigmas == [scheduler.sigma(step, max_steps) for step in range(max_steps + 2)], (
            f"{name}: sigma must be a pure function of (step, max_steps)"
        )


def make_training_batch(step: int, tokens: int = 64) -> TrainingBatch:
    """A seeded TrainingBatch of two random micro-batches (for transport tests)."""
    g = torch.Generator().manual_seed(step)
    return TrainingBatch(
        step=step,
        micro_batches=[_random_micro_batch(g, tokens), _random_micro_batch(g, max(tokens // 2, 1))],
        temperature=0.7,
        metrics={"reward": 0.25 * step},
    )


def _random_micro_batch(g: torch.Generator, tokens: int) -> MicroBatch:
    return MicroBatch(
        input_ids_T=torch.randint(0, 1000, (tokens,), generator=g),
        position_ids_T=torch.arange(tokens),
        loss_mask_T=torch.ones(tokens),
        advantages_T=torch.randn(tokens, generator=g),
        inference_logprobs_T=-torch.rand(tokens, generator=g),
        seq_lens_N=torch.tensor([tokens]),
        is_truncated_N=torch.tensor([False]),
    )


def assert_same_batch(a: TrainingBatch, b: TrainingBatch) -> None:
    """Equal step, temperature, metrics, and every tensor and count of every micro-batch (prefix trees too)."""
    assert (a.step, a.temperature, a.metrics, len(a.micro_batches)) == (
        b.step,
        b.temperature,
        b.metrics,
        len(b.micro_batches),
    )
    for x, y in zip(a.micro_batches, b.micro_batches):
        for name, value in vars(x).items():
            other = getattr(y, name)
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, other), name
            elif name == "prefix_tree" and value is not None and other is not None:
                for tree_name in ("input_ids_U", "position_ids_U", "node_T", "parent_U"):
                    assert torch.equal(getattr(value, tree_name), getattr(other, tree_name)), tree_name
            else:
                assert value == other, name


def process_group_gone(pgid: int, within: float) -> bool:
    """True once no process of the group `pgid` is left, waiting up to `within` seconds (a killed worker
    may linger as a zombie until reaped)."""
    import os

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def free_port() -> int:
    """A loopback port the OS just handed out, for a server or rendezvous that binds a fixed port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_tiny_model(path, seed: int = 0):
    """The tests' tiny model, saved to `path` (returned): a random 2-layer, hidden-64 Llama (head_dim 32,
    one key-value head) with SmolLM2's tokenizer, so that tests and benches run real code in seconds."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpokit.common.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_fit_argv(output_dir, model: str, run_name: str, *overrides: str, command: str = "fit") -> list[str]:
    """CLI arguments for a short run of the shipped reverse-text recipe on a small (test) model: LoRA
    rank 4, 2 prompts x 4 rollouts of <= 8 tokens per step, no filters, no progress bar. `overrides`
    come last, so they win over these values."""
    from importlib.resources import files

    recipe = files("grpokit.recipes") / "reverse_text.yaml"
    return [
        command,
        "--config",
        str(recipe),
        "--output_dir",
        str(output_dir),
        "--run_name",
        run_name,
        "--model.model",
        model,
        "--model.lora.rank",
        "4",
        "--data.batch_size",
        "8",
        "--data.rollouts_per_example",
        "4",
        "--data.sampling.max_tokens",
        "8",
        "--data.seq_len",
        "128",
        "--data.filters",
        "[]",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        *overrides,
    ]


class ScriptedServer:
    """An HTTP server on a real loopback socket that answers each POST with the next step of a script, for
    testing clients against a peer that misbehaves. Steps: a dict or list (a 200 answer with that JSON
    body), bytes (a 200 answer with that raw body), a tuple (status, headers, JSON body) for any other
    answer (a 429 with Retry-After, a redirect), "close" (the connection is dropped once the request is
    read), "half" (a 200 whose body stops halfway, then the connection drops), "hang" (no answer until
    stop()). The last step repeats. `request_times` holds the monotonic arrival time of every POST,
    `request_headers` its headers.

        with ScriptedServer(["close", {"choices": []}]) as server:
            RemoteEngine(base_url=server.url)
    """

    def __init__(self, script: list) -> None:
        import http.server
        import threading

        self.script, self.request_times, self.request_headers, self.released = list(script), [], [], threading.Event()
        scripted = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                step = scripted.script[min(len(scripted.request_times), len(scripted.script) - 1)]
                scripted.request_times.append(time.monotonic())
                scripted.request_headers.append(dict(self.headers))
                if step == "hang":
                    scripted.released.wait()
                if isinstance(step, str):
                    self.close_connection = True
                    if step == "half":
                        self.send_response(200)
                        self.send_header("Content-Length", "1000")
                        self.end_headers()
                        self.wfile.write(b'{"choices": [')
                    return
                status, headers = (step[0], step[1]) if isinstance(step, tuple) else (200, {})
                step = step[2] if isinstance(step, tuple) else step
                body = step if isinstance(step, bytes) else json.dumps(step).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def serving(model: str, broadcast=None, model_name: str = "tiny"):
    """The builtin engine (CPU) on `model` behind grpokit's OpenAI-compatible server on a free loopback
    port, following `broadcast` if given; yields (engine, server) and closes the server after."""
    from grpokit.inference.builtin import BuiltinEngine
    from grpokit.inference.server.http import make_app, make_server

    engine = BuiltinEngine(device="cpu")
    engine.setup(model)
    server = make_server(make_app(engine, engine.tokenizer, model_name=model_name, broadcast=broadcast), port=0).start()
    try:
        yield engine, server
    finally:
        server.close()


class ToolReplyTask:
    """A multi-turn task for tests: answers each reply with a numbered tool message (turn reward 0.5)
    until `max_turns` replies, whatever the model wrote (a random model writes no tool calls)."""

    max_turns = 3

    def respond(self, messages, state):
        from grpokit.orchestrator.conversation import EnvTurn

        state["n"] = state.get("n", 0) + 1
        return EnvTurn(messages=[{"role": "tool", "content": f"result {state['n']}"}], reward=0.5)


class ChatLengthEnv:
    """An environment stand-in for tests of multi-turn rollouts: a conversation's reward is its number
    of messages."""

    name = "three-turn"

    def score_conversations(self, examples, chats, states=None):
        return [(float(len(chat)), {}) for chat in chats]


def play(env, example, replies: list[str]):
    """A multi-turn rollout without an engine: the model's `replies`, each answered by the environment's
    turn (grpokit.orchestrator.conversation.environment_turn), until the environment ends the rollout."""
    from grpokit.orchestrator.conversation import Conversation, environment_turn

    conv = Conversation(env, example, [], [dict(m) for m in example.messages])
    for reply in replies:
        conv.messages.append({"role": "assistant", "content": reply})
        turn = environment_turn(conv)
        conv.turn_rewards.append(turn.reward)
        if turn.done:
            conv.done = True
            break
        conv.messages += turn.messages
    return conv


# multi-turn environments for end-to-end runs on the tiny random model: it rarely samples EOS, so replies
# stop on a common letter; the game answers each one ("Reply with one number ...") for up to 3 turns, and
# verifiers' user-sim Env has the engine play a simulated user (untrained) for up to 2 turns
MULTI_TURN_GAME_FLAGS = (
    "--data.env",
    "[{id: guess-number, args: {num_tasks: 50}, ratio: 0.5},"
    " {id: user-sim+reverse-text, env_args: {user: {max_turns: 2}}, ratio: 0.5}]",
    "--data.sampling.stop",
    "[e]",
    "--data.max_turns",
    "3",
)


def drain(stream) -> dict:
    """Advance a GenerationStream until nothing is in flight; each finished group's completions by its key."""
    out = {}
    while stream.inflight:
        for group in stream.advance():
            out[group.request.key] = group.completions
    return out


class ReplyEngine(InferenceEngine):
    """An InferenceEngine for tests that writes scripted replies: `reply(prompt_ids, i)` for the i-th of
    each prompt's n completions (subclasses define it); no model, no weights."""

    def __init__(self, tokenizer) -> None:
        self.tok, self.end = tokenizer, tokenizer.convert_tokens_to_ids("<|im_end|>")

    def setup(self, model) -> None:
        pass

    def load_weights(self, update) -> None:
        pass

    def generate(self, prompts, n, sampling):
        return [[self.reply(ids, i) for i in range(n)] for ids in prompts]

    @abstractmethod
    def reply(self, prompt_ids: list[int], i: int):
        """The Completion of the i-th reply to `prompt_ids` (abstract: not a component of the registry)."""


def in_background(fn, *args) -> tuple[threading.Thread, list]:
    """Run fn(*args) in a daemon thread; the list gets its result."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(fn(*args)), daemon=True)
    thread.start()
    return thread, result


def wait_until(condition, timeout: float = 10.0) -> None:
    """Poll `condition` every 10 ms until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
