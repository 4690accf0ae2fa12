"""The SFT loss mask is exactly the assistant tokens, token by token against the chat template's
rendering, and each assistant turn starts where a rollout's completion would (its prompt rendered as
rollouts render it)."""

import pytest

from grpokit.common.models import load_tokenizer
from grpokit.environments.chat_tokens import ChatTokens
from grpokit.sft.render import ChatRenderer
from grpokit.sft.sources import SFTFields, record_chats

pytestmark = pytest.mark.unit

CALL = {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "12 * 34"}'}}
CHAT = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "What is 12 * 34?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "content": "408"},
    {"role": "assistant", "content": "It is 408."},
    {"role": "user", "content": "And halved?"},
    {"role": "assistant", "content": "204."},
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2-135m")  # the tiny test model's tokenizer (ChatML)


def expected(tokenizer, chat):
    """ChatML by hand: each message `<|im_start|>role\\ncontent<|im_end|>\\n`; mask 1 on an assistant's
    content and its <|im_end|> (the token a sampled completion stops on and keeps), 0 elsewhere."""
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    start, end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    ids, mask = [], []
    for m in chat:
        head, body = [start] + encode(m["role"] + "\n"), encode(m["content"]) + [end]
        trained = m["role"] == "assistant"
        ids += head + body + encode("\n")
        mask += [0] * len(head) + [int(trained)] * len(body) + [0] * len(encode("\n"))
    return ids, mask


def test_the_mask_is_exactly_the_assistant_tokens_of_a_tool_using_conversation(tokenizer):
    rendered = ChatRenderer(tokenizer).render(CHAT)
    # SmolLM2's template drops structured tool calls: they are written as the Hermes text rollouts parse
    call_text = '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>'
    by_hand = [{**m, "content": call_text} if m.get("tool_calls") else m for m in CHAT]
    ids, mask = expected(tokenizer, by_hand)
    assert rendered.input_ids == ids
    assert rendered.loss_mask == mask
    assert tokenizer.decode(rendered.input_ids) == tokenizer.apply_chat_template(by_hand, tokenize=False)
    spans = [tokenizer.decode([t for t, m in zip(ids, mask) if m])]
    assert spans == [f"{call_text}<|im_end|>It is 408.<|im_end|>204.<|im_end|>"]  # no system, user or tool token


def test_each_assistant_turn_starts_after_the_prompt_a_rollout_would_have(tokenizer):
    rendered = ChatRenderer(tokenizer).render(CHAT)
    chat = ChatTokens(tokenizer)
    starts = [t for t in range(1, len(rendered.loss_mask)) if rendered.loss_mask[t] and not rendered.loss_mask[t - 1]]
    call_text = '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>'
    as_text = [{"role": m["role"], "content": call_text if m.get("tool_calls") else m["content"]} for m in CHAT]
    turns = [i for i, m in enumerate(CHAT) if m["role"] == "assistant"]
    assert len(starts) == len(turns) == 3
    for start, i in zip(starts, turns):
        assert rendered.input_ids[:start] == chat.prompt(as_text[:i])


def test_prompt_completion_pairs_render_as_a_user_and_an_assistant_message(tokenizer):
    records = [{"question": "Reverse: abc", "reply": "cba"}]
    ((messages, tools),) = record_chats(records, SFTFields(prompt="question", completion="reply"), "test")
    assert tools is None
    rendered = ChatRenderer(tokenizer).render(messages)
    default_system = {
        "role": "system",
        "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    }
    ids, mask = expected(tokenizer, [default_system, *messages])  # the template adds its default system prompt
    assert (rendered.input_ids, rendered.loss_mask) == (ids, mask)
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == "cba<|im_end|>"


def test_truncation_keeps_the_mask_of_the_kept_tokens(tokenizer):
    rendered = ChatRenderer(tokenizer).render(CHAT)
    cut = rendered.cut(20)
    assert cut.truncated and cut.input_ids == rendered.input_ids[:20] and cut.loss_mask == rendered.loss_mask[:20]
