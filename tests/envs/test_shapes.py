"""shapes: which questions a taskset asks (one, "mixed", "all", or a list, so a stage can hold one out),
each picture's labels, and that a seed draws the same tasks."""

import collections

import pytest

from grpokit.environments.environment import Environment, EnvSpec

FIRST_WORD = {"What": "colour", "Which": "shape", "Is": "position", "How": "count"}
VALUES = {
    "colour": {"red", "green", "blue", "yellow", "purple", "orange"},
    "kind": {"circle", "square", "triangle"},
    "side": {"left", "right"},
}


def load(**args) -> Environment:
    return Environment(EnvSpec(id="shapes", args={"num_tasks": 120, "size": 48, **args}))


def asked(env: Environment) -> collections.Counter:
    return collections.Counter(FIRST_WORD[ex.messages[0]["content"][1]["text"].split()[0]] for ex in env.examples)


def test_a_list_of_questions_asks_only_those_and_all_asks_each_of_the_four():
    held_out = asked(load(question=["colour", "position", "count"]))
    assert set(held_out) == {"colour", "position", "count"} and min(held_out.values()) > 20, held_out
    assert set(asked(load(question="all"))) == {"colour", "shape", "position", "count"}
    assert set(asked(load(question="shape"))) == {"shape"}


def test_a_seed_draws_the_same_tasks_and_the_labels_say_what_the_picture_shows():
    one, two = load(question="all", seed=4), load(question="all", seed=4)
    assert [ex.task.data.answer for ex in one.examples] == [ex.task.data.answer for ex in two.examples]
    for ex in one.examples:
        data, kind = ex.task.data, FIRST_WORD[ex.messages[0]["content"][1]["text"].split()[0]]
        assert data.labels["colour"] == data.colour and data.labels["kind"] == data.shape
        label = {"colour": "colour", "shape": "kind", "position": "side", "count": "count"}[kind]
        assert data.labels[label] == data.answer, (kind, data.labels, data.answer)


def test_an_empty_list_of_questions_is_refused_naming_the_choices():
    with pytest.raises(Exception, match="colour, shape, position, count"):
        load(question=[])


def test_describe_asks_for_colour_kind_and_side_and_scores_each_third():
    import asyncio

    from grpokit.envs.shapes import fields_named

    env = load(question="describe", num_tasks=12)
    for ex in env.examples:
        data = ex.task.data
        assert ex.messages[0]["content"][1]["text"].startswith("Describe the shape in three words")
        assert data.answer == f"{data.colour} {data.shape} {data.labels['side']}"
    labels = {"colour": "red", "kind": "circle", "side": "left", "count": "one"}
    assert fields_named("Red circle, left.", labels) == 1.0
    assert fields_named("red circle", labels) == 2 / 3
    assert fields_named("A red or blue circle on the left", labels) == 2 / 3  # two colours named: colour earns nothing
    assert fields_named("blue square right", labels) == 0.0
    task = env.examples[0].task
    assert task.parse_answer("It is a RIGHT red circle") == "red circle right"
    trace = type("Trace", (), {"last_reply": task.data.answer.upper()})()
    assert asyncio.run(task.correct(trace)) == 1.0


def test_verify_asks_yes_or_no_about_colour_kind_or_side_true_half_the_time():
    env = load(question="verify", num_tasks=200)
    kinds, answers = collections.Counter(), collections.Counter()
    for ex in env.examples:
        data, text = ex.task.data, ex.messages[0]["content"][1]["text"]
        named = text.split("?")[0].split()[-1]
        field = next(f for f, values in VALUES.items() if named in values)
        assert text.endswith("Answer yes or no.") and data.answer == ("yes" if data.labels[field] == named else "no")
        kinds[field] += 1
        answers[data.answer] += 1
    assert min(kinds.values()) > 40 and min(answers.values()) > 70, (kinds, answers)
    held_out = load(question="verify", num_tasks=60, verify_about=["colour", "side"])
    named = {ex.messages[0]["content"][1]["text"].split("?")[0].split()[-1] for ex in held_out.examples}
    assert named and not named & VALUES["kind"], named


def test_describe_and_verify_are_not_among_all_and_describe_refuses_a_retry_game():
    assert set(asked(load(question="all"))) == {"colour", "shape", "position", "count"}
    with pytest.raises(Exception, match="tries: 1"):
        load(question="describe", tries=2)
