"""docs/environments.md works as written. Its files (fenced blocks with a `title="name"`) are copied into a
folder on sys.path; each environment loads by its id through verifiers' loader, as a user's installed
module would, and answers scripted replies (no engine, no model) with the tool results, turn rewards and
rubric rewards the page describes. A scripted engine then runs the multi-turn environment through the
orchestrator's rollout path to check what the trainer sees (masks, step rewards, the budget), and plays
the page's verifiers Env (recount) paired with its taskset."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from grpokit.environments.conversation import is_multi_turn
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.inference import Completion, SamplingSettings
from tests.support import ReplyEngine, play

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "environments.md").read_text()
FILES = {name: code for name, code in re.findall(r'```\w+ title="([\w.]+)"\n(.*?)```', DOC, re.S)}
MODULES = ("count_letters", "warehouse", "mental_math", "count_dots")


def test_the_page_has_its_files():
    assert sorted(FILES) == sorted(["my_envs.yaml", "my_image_envs.yaml", "recount.py", *(f"{m}.py" for m in MODULES)])


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The page's files in a folder on sys.path (the modules are forgotten afterwards)."""
    folder = tmp_path_factory.mktemp("doc-envs")
    for name, code in FILES.items():
        (folder / name).write_text(code)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(folder))
        yield folder
    for module in (*MODULES, "recount"):
        sys.modules.pop(module, None)


@pytest.fixture(scope="module")
def envs(site):
    """Each page environment loaded by its id, as `data.env: [{id: ...}]` does."""
    loaded = {m: Environment(EnvSpec(id=m.replace("_", "-"), args={"num_tasks": 6})) for m in MODULES}
    for m in MODULES:  # not a built-in: verifiers' loader imported the page's own file
        assert Path(sys.modules[m].__file__).parent == site
    return loaded


def call(item: str) -> str:
    return f'<tool_call>{{"name": "stock", "arguments": {{"item": "{item}"}}}}</tool_call>'


def test_single_turn_taskset_loads_by_id_and_scores(envs):
    env = envs["count_letters"]
    assert len(env.examples) == 6
    ex = env.examples[0]
    assert ex.messages[0] == {"role": "system", "content": "Reply with a number only."}
    word = re.fullmatch(r"How many letters has the word '(\w+)'\?", ex.messages[1]["content"]).group(1)
    assert not is_multi_turn(ex.task)
    replies = [str(len(word)), f"It has {len(word)} letters.", str(len(word) + 1), "no idea"]
    scores = env.score([ex] * 4, replies)
    assert [r for r, _ in scores] == [1.0, 1.0, 0.0, 0.0]
    assert [m for _, m in scores] == [{"reply_chars": float(len(r))} for r in replies]
    with pytest.raises(ValueError, match="data.env id 'count-letters': bad args"):
        Environment(EnvSpec(id="count-letters", args={"num_task": 3}))


def test_the_image_taskset_puts_a_picture_in_each_prompt_and_scores_the_count(envs):
    """count-dots: a user message of an image part (a PNG data: URL that decodes to the picture) and the
    question; the reward reads the reply's first number. Its fit on a vision-language model:
    tests/vision/test_image_env_doc.py."""
    from grpokit.vision.messages import has_images, prompt_images

    env = envs["count_dots"]
    ex = env.examples[0]
    assert has_images(ex.messages) and [p["type"] for p in ex.messages[0]["content"]] == ["image_url", "text"]
    _, (picture,) = prompt_images(ex.messages)
    assert picture.size == (64, 64)
    count = ex.task.data.answer
    replies = [str(count), f"There are {count} dots.", str(count + 1), "many"]
    assert [r for r, _ in env.score([ex] * 4, replies)] == [1.0, 1.0, 0.0, 0.0]


def test_the_recipe_overlay_parses_and_loads(site, monkeypatch):
    from grpokit.cli import parse_recipe

    specs = [EnvSpec(**entry) for entry in yaml.safe_load(FILES["my_envs.yaml"])["data"]["env"]]
    letters, warehouse, quiz = (Environment(spec) for spec in specs)
    assert (len(letters.examples), len(warehouse.examples), len(quiz.examples)) == (200, 500, 500)
    assert quiz.name == "quiz" and letters.name == "count-letters"
    assert max(a for ex in quiz.examples for a in ex.task.data.answers) > 18  # args: max_value 20, not 9
    monkeypatch.chdir(ROOT)
    resolved = yaml.safe_load(
        parse_recipe(["--config", "recipes/reverse_text.yaml", "--config", str(site / "my_envs.yaml")])
    )
    assert [(e["id"], e["ratio"]) for e in resolved["data"]["env"]] == [
        ("count-letters", 0.5),
        ("warehouse", 0.25),
        ("mental-math", 0.25),
    ]
    assert resolved["data"]["max_turns"] == 3


def test_tool_environment_runs_the_tool_and_rewards_its_use(envs, monkeypatch):
    env, stock = envs["warehouse"], sys.modules["warehouse"].STOCK
    ex = env.examples[0]
    fruit = re.fullmatch(r"How many crates of (\w+) are in stock\?", ex.messages[-1]["content"]).group(1)
    answer = stock[fruit]
    assert is_multi_turn(ex.task) and fruit != "figs"
    # the docstring became the schema the system prompt lists, and the worked example precedes the question
    assert '"description": "Count the crates of one fruit in the warehouse."' in ex.messages[0]["content"]
    assert '"item": {"type": "string", "description": "the fruit, e.g. \\"apples\\"."}' in ex.messages[0]["content"]
    assert [m["role"] for m in ex.messages] == ["system", "user", "assistant", "tool", "assistant", "user"]

    good = play(env, ex, [call(fruit), str(answer)])
    assert good.messages[-2] == {"role": "tool", "content": str(answer)} and good.done
    assert (good.tool_calls, good.tool_errors) == (1, 0)
    bad = play(env, ex, [call("kiwis"), "<tool_call>{not json}</tool_call>", "12"])
    errors = [m["content"] for m in bad.messages[len(ex.messages) :] if m["role"] == "tool"]
    assert errors[0].startswith("Error: ValueError: no 'kiwis' in the warehouse; it holds ['apples', 'figs'")
    assert errors[1].startswith("Error: the tool call is not valid JSON")
    assert (bad.tool_calls, bad.tool_errors) == (2, 2)
    listed = play(
        env,
        ex,
        [
            '<tool_call>[{"name": "stock", "arguments": {"item": "pears"}}, '
            '{"name": "stock", "arguments": {"item": "plums"}}]</tool_call>',
            f"So {answer}",
        ],
    )
    assert [m["content"] for m in listed.messages if m["role"] == "tool"][1:] == ["37", "1290"]
    no_tool = play(env, ex, [str(answer)])
    assert no_tool.done and no_tool.tool_calls == 0

    scores = env.score_conversations([ex] * 4, [c.messages for c in (good, bad, listed, no_tool)])
    assert [round(r, 9) for r, _ in scores] == [1.2, 0.0, 1.2, 1.0]
    assert [m["used_tool"] for _, m in scores] == [1.0, 1.0, 1.0, 0.0]

    def stock_slowly(item: str) -> int:  # named like the real tool, so the model's call reaches it
        import time

        time.sleep(1.0)
        return stock[item]

    stock_slowly.__name__ = "stock"
    monkeypatch.setattr(ex.task, "tools", (stock_slowly,))
    monkeypatch.setattr(ex.task, "tool_timeout", 0.2)  # the task's own timeout is used (the default is 10 s)
    slow = play(env, ex, [call(fruit), "0"])
    assert slow.messages[len(ex.messages) + 1] == {
        "role": "tool",
        "content": "Error: the tool 'stock' took longer than 0.2 s",
    }
    assert slow.tool_timeouts == 1


def test_multi_turn_environment_grades_each_turn(envs):
    env = envs["mental_math"]
    ex = env.examples[0]
    q, a = ex.task.data.questions, ex.task.data.answers
    assert is_multi_turn(ex.task) and ex.messages[-1] == {"role": "user", "content": q[0]}
    conv = play(env, ex, [str(a[0]), str(a[1] + 1), f"{a[2]}, easy", "extra"])
    assert conv.done and conv.turn_rewards == [1.0, 0.0, 1.0]  # the third answer ended the quiz
    assert [m["content"] for m in conv.messages if m["role"] == "user"][1:] == [
        f"Right. Next: {q[1]}",
        f"Wrong, it is {a[1]}. Next: {q[2]}",
    ]
    assert conv.state == {"graded": [True, False, True]}
    wrong = play(env, ex, ["0", "0", "0"])
    (r, metrics), (r_wrong, _) = env.score_conversations([ex] * 2, [conv.messages, wrong.messages])
    assert r == pytest.approx(2 / 3) and metrics == {"answered": 3.0} and r_wrong == 0.0


class QuizEngine(ReplyEngine):
    """Answers the last question of each prompt: rollout A always right; rollout B first wrong, then right,
    and its reply to turn `cut_turn` (0-based) runs into max_tokens."""

    def __init__(self, tokenizer, cut_turn: int | None = None) -> None:
        super().__init__(tokenizer)
        self.cut_turn = cut_turn

    def reply(self, ids, i):
        text = self.tok.decode(ids)
        turn = text.count("<|im_start|>assistant") - 1
        is_b = (turn == 0 and i == 1) or "Wrong" in text
        x, y = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1])
        if is_b and turn == self.cut_turn:
            ids = self.tok.encode(f"{x + y} is the answer because", add_special_tokens=False)[:4]
            return Completion(ids, [-0.5] * len(ids), True, 0)
        ids = self.tok.encode(str(x + y + (is_b and turn == 0)), add_special_tokens=False) + [self.end]
        return Completion(ids, [-0.5] * len(ids), False, 0)


@pytest.fixture(scope="module")
def tokenizer():
    from grpokit.common.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


def quiz_rollouts(env, tokenizer, turns, cut_turn=None):
    from grpokit.orchestrator.group_play import generate_rollouts

    sampling = SamplingSettings(max_tokens=8, seed=0)
    (group,) = generate_rollouts(
        QuizEngine(tokenizer, cut_turn), tokenizer, [(env, env.examples[0])], 2, sampling, 0, turns=turns
    )
    return group


def test_what_the_trainer_sees(envs, tokenizer):
    from grpokit.environments.chat_tokens import ChatTokens
    from grpokit.orchestrator.rollouts import TurnLimits
    from grpokit.registry.advantages.process import Process

    env, chat = envs["mental_math"], ChatTokens(tokenizer)
    # data.max_turns 1 is below the task's own max_turns 3, which wins
    a, b = quiz_rollouts(env, tokenizer, TurnLimits(max_turns=1, budget=1024))
    assert (a.metrics["turns"], b.metrics["turns"]) == (3.0, 3.0) and not (a.is_truncated or b.is_truncated)
    assert (a.reward, b.reward) == (1.0, pytest.approx(2 / 3))
    assert (a.step_rewards, b.step_rewards) == ([1.0, 1.0, 1.0], [0.0, 1.0, 1.0])
    assert [m["role"] for m in b.messages] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    for r in (a, b):
        # engine tokens: mask 1 and the engine's logprobs; each run of environment tokens: mask 0, logprob 0,
        # exactly the rendering of its message after the reply before it (nothing re-tokenised)
        assert r.step_ends == [
            i
            for i, t in enumerate(r.completion_ids)
            if t == tokenizer.convert_tokens_to_ids("<|im_end|>") and r.completion_mask[i]
        ]
        starts = [
            i for i in range(1, len(r.completion_mask)) if r.completion_mask[i - 1] == 1 and r.completion_mask[i] == 0
        ]
        follow_ups = [m for m in r.messages[len(env.examples[0].messages) :] if m["role"] == "user"]
        assert len(starts) == 2
        for start, message in zip(starts, follow_ups):
            env_ids = chat.after_completion(r.completion_ids[:start], [message])
            assert r.completion_ids[start : start + len(env_ids)] == env_ids
            assert set(r.completion_mask[start : start + len(env_ids)]) == {0}
            assert set(r.completion_logprobs[start : start + len(env_ids)]) == {0.0}
        assert all(lp == -0.5 for lp, m in zip(r.completion_logprobs, r.completion_mask) if m)
    adv_a, adv_b = Process().token_advantages([[a, b]])
    assert adv_b[0] < adv_a[0]  # B's wrong first answer costs its first turn
    assert adv_b[-1] == pytest.approx(adv_a[-1]) and adv_a[-1] != 0  # the last turns were both right

    # the budget: room for the prompt and one turn only, so the rollout ends at the first boundary
    prompt_len = len(chat.prompt(env.examples[0].messages))
    a, b = quiz_rollouts(env, tokenizer, TurnLimits(max_turns=8, budget=prompt_len + 2 * 8))
    for r in (a, b):
        assert r.is_truncated and r.metrics["turns"] == 1.0 and set(r.completion_mask) == {1}
    assert (a.step_rewards, b.step_rewards) == ([1.0], [0.0])

    # B's second reply is cut at max_tokens: the rollout ends there, and the cut turn earns 0
    a, b = quiz_rollouts(env, tokenizer, TurnLimits(max_turns=8, budget=1024), cut_turn=1)
    assert b.is_truncated and b.metrics["turns"] == 2.0 and b.step_rewards == [0.0, 0.0]
    assert b.step_ends[-1] == len(b.completion_ids) - 1
    adv_a, adv_b = Process().token_advantages([[a, b]])
    assert adv_b[0] < 0 and adv_b[-1] < adv_a[-1]


class CountEngine(ReplyEngine):
    """Answers count-letters: right, except every second first reply (one letter too many): a group's
    episodes ask in order, each its own request."""

    firsts = 0

    def reply(self, ids, i):
        text = self.tok.decode(ids)
        word = re.findall(r"How many letters has the word '(\w+)'", text)[-1]
        first = "Count again" not in text
        self.firsts += first
        wrong = first and self.firsts % 2 == 0
        ids = self.tok.encode(str(len(word) + wrong), add_special_tokens=False) + [self.end]
        return Completion(ids, [-0.5] * len(ids), False, 0)


def test_the_verifiers_env_coaches_a_second_try(site, tokenizer):
    from grpokit.orchestrator.group_play import TurnLimits, generate_rollouts

    spec = EnvSpec(id="recount+count-letters", args={"num_tasks": 6}, env_args={"hint": "Count again."})
    env = Environment(spec)
    assert type(env.episode_env).__name__ == "Recount" and env.episode_env.config.hint == "Count again."
    sampling = SamplingSettings(max_tokens=8, seed=0)
    (right, retried) = generate_rollouts(
        CountEngine(tokenizer), tokenizer, [(env, env.examples[0])], 2, sampling, 0, turns=TurnLimits(8, 1024)
    )[0]
    assert (right.reward, right.metrics["tries"], right.metrics["turns"]) == (1.0, 1.0, 1.0)
    assert (retried.reward, retried.metrics["tries"], retried.metrics["turns"]) == (1.0, 2.0, 2.0)
    assert retried.messages[-2] == {"role": "user", "content": "Count again."}
    assert retried.prompt_ids == right.prompt_ids  # the task's prompt opened both episodes
    assert 0 in retried.completion_mask and set(right.completion_mask) == {1}
