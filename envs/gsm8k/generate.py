"""Writes the gsm8k environment's sample: 200 grade-school word problems, made up here, in GSM8K's format.

Each problem comes from one of the templates below, half from a one-step template (ONE_STEP) and half
from a two-step one (TWO_STEP), with seeded random names and small whole numbers (every intermediate
value a positive integer). Its answer is a worked solution, one sentence per step with the computation
written out ("3 * 4 = 12"), then `#### N`. None of the text comes from GSM8K. Problems are drawn until
200 distinct questions exist, then shuffled and split into 160 train and 40 eval rows (train.jsonl,
eval.jsonl next to this file).

    python -m grpokit.envs.gsm8k.generate      # rewrites the two files; the same seed gives the same bytes
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

SEED = 2026
NUM_TRAIN, NUM_EVAL = 160, 40
HERE = Path(__file__).parent


class Person(NamedTuple):
    name: str
    they: str  # "she" / "he"
    their: str  # "her" / "his"


PEOPLE = [
    Person(*p)
    for p in (
        ("Maria", "she", "her"),
        ("James", "he", "his"),
        ("Aisha", "she", "her"),
        ("Kenji", "he", "his"),
        ("Lucy", "she", "her"),
        ("Diego", "he", "his"),
        ("Nora", "she", "her"),
        ("Sam", "he", "his"),
        ("Priya", "she", "her"),
        ("Tom", "he", "his"),
        ("Hana", "she", "her"),
        ("Leo", "he", "his"),
    )
]
FRIENDS = ("Ella", "Max", "Ivy", "Omar", "Rosa", "Finn")
FRUITS = ("apples", "oranges", "pears", "peaches", "plums")
TOYS = ("marbles", "stickers", "cards", "stamps", "shells")

Problem = tuple[str, list[str], int]  # question, solution sentences, answer
Template = Callable[[random.Random, Person], Problem]


def r(rng: random.Random, low: int, high: int) -> int:
    return rng.randint(low, high)


def packs(rng: random.Random, p: Person) -> Problem:
    n, k, item = r(rng, 2, 9), r(rng, 2, 10), rng.choice(TOYS)
    q = f"{p.name} buys {n} packs of {item}. Each pack has {k} {item}. How many {item} does {p.name} buy?"
    return q, [f"{p.name} buys {n} * {k} = {n * k} {item}."], n * k


def picked(rng: random.Random, p: Person) -> Problem:
    a, b, fruit = r(rng, 3, 20), r(rng, 3, 20), rng.choice(FRUITS)
    q = (
        f"{p.name} picked {a} {fruit} in the morning and {b} {fruit} in the afternoon. "
        f"How many {fruit} did {p.they} pick?"
    )
    return q, [f"{p.name} picked {a} + {b} = {a + b} {fruit}."], a + b


def eats_and_buys(rng: random.Random, p: Person) -> Problem:
    a, fruit = r(rng, 8, 20), rng.choice(FRUITS)
    b, c = r(rng, 1, a - 1), r(rng, 2, 10)
    q = (
        f"{p.name} has {a} {fruit}. {p.they.capitalize()} eats {b} of them and then buys {c} more. "
        f"How many {fruit} does {p.name} have now?"
    )
    return (
        q,
        [
            f"After eating, {p.they} has {a} - {b} = {a - b} {fruit}.",
            f"Then {p.they} has {a - b} + {c} = {a - b + c} {fruit}.",
        ],
        a - b + c,
    )


def spend(rng: random.Random, p: Person) -> Problem:
    n, price, thing = r(rng, 2, 9), r(rng, 2, 10), rng.choice(("notebooks", "pens", "toy cars", "cupcakes"))
    q = f"At a shop, {thing} cost ${price} each. {p.name} buys {n} {thing}. How many dollars does {p.they} spend?"
    return q, [f"{p.name} spends {n} * {price} = ${n * price}."], n * price


def change(rng: random.Random, p: Person) -> Problem:
    n, price = r(rng, 2, 6), r(rng, 2, 9)
    money = n * price + r(rng, 1, 20)
    q = (
        f"{p.name} has ${money}. {p.they.capitalize()} buys {n} books that cost ${price} each. "
        f"How many dollars does {p.they} have left?"
    )
    return (
        q,
        [
            f"The books cost {n} * {price} = ${n * price}.",
            f"{p.name} has {money} - {n * price} = ${money - n * price} left.",
        ],
        money - n * price,
    )


def share(rng: random.Random, p: Person) -> Problem:
    each, friends, item = r(rng, 2, 9), r(rng, 2, 6), rng.choice(TOYS)
    total = each * friends
    q = (
        f"{p.name} has {total} {item} and shares them equally among {friends} friends. "
        f"How many {item} does each friend get?"
    )
    return q, [f"Each friend gets {total} / {friends} = {each} {item}."], each


def reading(rng: random.Random, p: Person) -> Problem:
    per_day, days = r(rng, 2, 10), r(rng, 2, 7)
    book = per_day * days + r(rng, 5, 40)
    q = (
        f"A book has {book} pages. {p.name} reads {per_day} pages every day for {days} days. "
        f"How many pages are left to read?"
    )
    return (
        q,
        [
            f"{p.name} reads {per_day} * {days} = {per_day * days} pages.",
            f"There are {book} - {per_day * days} = {book - per_day * days} pages left.",
        ],
        book - per_day * days,
    )


def legs(rng: random.Random, p: Person) -> Problem:
    hens, ducks = r(rng, 2, 10), r(rng, 2, 8)
    q = f"On {p.name}'s farm there are {hens} chickens and {ducks} ducks. How many legs do the birds have in total?"
    steps = [
        f"There are {hens} + {ducks} = {hens + ducks} birds.",
        f"Each bird has 2 legs, so they have {hens + ducks} * 2 = {(hens + ducks) * 2} legs.",
    ]
    return q, steps, (hens + ducks) * 2


def cookies(rng: random.Random, p: Person) -> Problem:
    trays, per_tray = r(rng, 2, 5), r(rng, 4, 10)
    given = r(rng, 1, trays * per_tray - 1)
    q = (
        f"{p.name} bakes {trays} trays of cookies with {per_tray} cookies on each tray. "
        f"{p.they.capitalize()} gives away {given} cookies. How many cookies does {p.they} have left?"
    )
    return (
        q,
        [
            f"{p.name} bakes {trays} * {per_tray} = {trays * per_tray} cookies.",
            f"{p.they.capitalize()} has {trays * per_tray} - {given} = {trays * per_tray - given} cookies left.",
        ],
        trays * per_tray - given,
    )


def savings(rng: random.Random, p: Person) -> Problem:
    start, weekly, weeks = r(rng, 5, 20), r(rng, 2, 9), r(rng, 2, 5)
    q = (
        f"{p.name} has ${start} in a piggy bank. {p.they.capitalize()} adds ${weekly} every week for {weeks} weeks. "
        f"How many dollars are in the piggy bank now?"
    )
    return (
        q,
        [
            f"{p.name} adds {weekly} * {weeks} = ${weekly * weeks}.",
            f"The piggy bank has {start} + {weekly * weeks} = ${start + weekly * weeks}.",
        ],
        start + weekly * weeks,
    )


def fewer(rng: random.Random, p: Person) -> Problem:
    a, item, friend = r(rng, 8, 20), rng.choice(TOYS), rng.choice(FRIENDS)
    b = r(rng, 1, a - 1)
    q = f"{p.name} has {a} {item}. {friend} has {b} fewer {item} than {p.name}. How many {item} do they have together?"
    return (
        q,
        [f"{friend} has {a} - {b} = {a - b} {item}.", f"Together they have {a} + {a - b} = {2 * a - b} {item}."],
        2 * a - b,
    )


def twice(rng: random.Random, p: Person) -> Problem:
    a, item, friend = r(rng, 3, 15), rng.choice(TOYS), rng.choice(FRIENDS)
    q = (
        f"{p.name} has {a} {item}. {friend} has twice as many {item} as {p.name}. "
        f"How many {item} do they have together?"
    )
    return q, [f"{friend} has {a} * 2 = {2 * a} {item}.", f"Together they have {a} + {2 * a} = {3 * a} {item}."], 3 * a


def half(rng: random.Random, p: Person) -> Problem:
    a, b = 2 * r(rng, 2, 10), r(rng, 2, 10)
    q = (
        f"{p.name} had {a} balloons. {p.they.capitalize()} gave half of them to {p.their} sister "
        f"and then bought {b} more. How many balloons does {p.name} have now?"
    )
    return (
        q,
        [
            f"{p.name} gave away {a} / 2 = {a // 2} balloons and kept {a // 2}.",
            f"Now {p.they} has {a // 2} + {b} = {a // 2 + b} balloons.",
        ],
        a // 2 + b,
    )


def distance(rng: random.Random, p: Person) -> Problem:
    speed, hours = r(rng, 3, 10), r(rng, 2, 5)
    q = f"{p.name} rides a bike at {speed} miles per hour for {hours} hours. How many miles does {p.they} ride?"
    return q, [f"{p.name} rides {speed} * {hours} = {speed * hours} miles."], speed * hours


def bus(rng: random.Random, p: Person) -> Problem:
    riders = r(rng, 8, 25)
    off, on = r(rng, 2, riders - 1), r(rng, 1, 10)
    q = (
        f"{p.name}'s bus has {riders} passengers. "
        f"At the next stop {off} passengers get off and {on} get on. How many passengers are on the bus now?"
    )
    return (
        q,
        [
            f"After the stop there are {riders} - {off} = {riders - off} passengers.",
            f"Then {riders - off} + {on} = {riders - off + on} passengers are on the bus.",
        ],
        riders - off + on,
    )


def garden(rng: random.Random, p: Person) -> Problem:
    rows, per_row = r(rng, 2, 6), r(rng, 3, 8)
    dead = r(rng, 1, rows * per_row - 1)
    q = (
        f"{p.name} plants {rows} rows of tulips with {per_row} tulips in each row. "
        f"{dead} tulips do not grow. How many tulips grow?"
    )
    return (
        q,
        [
            f"{p.name} plants {rows} * {per_row} = {rows * per_row} tulips.",
            f"{rows * per_row} - {dead} = {rows * per_row - dead} tulips grow.",
        ],
        rows * per_row - dead,
    )


def tickets(rng: random.Random, p: Person) -> Problem:
    adult, child, kids = r(rng, 6, 15), r(rng, 2, 5), r(rng, 2, 4)
    q = (
        f"Zoo tickets cost ${adult} for an adult and ${child} for a child. "
        f"How many dollars do {p.name} and {p.their} {kids} children pay, if {p.name} is the only adult?"
    )
    return (
        q,
        [
            f"The children's tickets cost {kids} * {child} = ${kids * child}.",
            f"Together they pay {adult} + {kids * child} = ${adult + kids * child}.",
        ],
        adult + kids * child,
    )


def week(rng: random.Random, p: Person) -> Problem:
    km = r(rng, 2, 9)
    q = f"{p.name} walks {km} kilometers every day. How many kilometers does {p.they} walk in one week?"
    return q, [f"A week has 7 days, so {p.name} walks {km} * 7 = {km * 7} kilometers."], km * 7


def fish(rng: random.Random, p: Person) -> Problem:
    start, weekly, weeks = r(rng, 2, 10), r(rng, 1, 4), r(rng, 2, 6)
    q = (
        f"{p.name} has {start} fish. {p.they.capitalize()} buys {weekly} new fish every week for {weeks} weeks. "
        f"How many fish does {p.they} have then?"
    )
    return (
        q,
        [
            f"{p.name} buys {weekly} * {weeks} = {weekly * weeks} fish.",
            f"{p.they.capitalize()} has {start} + {weekly * weeks} = {start + weekly * weeks} fish.",
        ],
        start + weekly * weeks,
    )


def gives(rng: random.Random, p: Person) -> Problem:
    a, item, friend = r(rng, 5, 20), rng.choice(TOYS), rng.choice(FRIENDS)
    b = r(rng, 1, a - 1)
    q = f"{p.name} has {a} {item}. {p.they.capitalize()} gives {b} {item} to {friend}. How many {item} are left?"
    return q, [f"{p.name} has {a} - {b} = {a - b} {item} left."], a - b


def more(rng: random.Random, p: Person) -> Problem:
    a, b, item, friend = r(rng, 3, 20), r(rng, 2, 15), rng.choice(TOYS), rng.choice(FRIENDS)
    q = f"{p.name} has {a} {item}. {friend} gives {p.their} {b} more {item}. How many {item} does {p.name} have now?"
    return q, [f"{p.name} has {a} + {b} = {a + b} {item}."], a + b


def dogs(rng: random.Random, p: Person) -> Problem:
    n = r(rng, 2, 9)
    q = f"{p.name} walks {n} dogs in the park. Each dog has 4 legs. How many legs do the dogs have in total?"
    return q, [f"The dogs have {n} * 4 = {n * 4} legs."], n * 4


ONE_STEP: list[Template] = [packs, picked, spend, share, distance, week, gives, more, dogs]
TWO_STEP: list[Template] = [
    eats_and_buys, change, reading, legs, cookies, savings, fewer, twice, half, bus, garden, tickets, fish,
]  # fmt: skip


def make_rows(count: int, seed: int) -> list[dict[str, str]]:
    """`count` distinct problems as GSM8K rows {"question", "answer"}, in a seeded shuffled order."""
    rng, seen, out = random.Random(seed), set(), []
    while len(out) < count:
        template = rng.choice(ONE_STEP if rng.random() < 0.5 else TWO_STEP)
        question, steps, answer = template(rng, rng.choice(PEOPLE))
        if question not in seen:
            seen.add(question)
            out.append({"question": question, "answer": "\n".join([*steps, f"#### {answer}"])})
    rng.shuffle(out)
    return out


def write(folder: Path = HERE) -> None:
    rows = make_rows(NUM_TRAIN + NUM_EVAL, SEED)
    for name, part in (("train.jsonl", rows[:NUM_TRAIN]), ("eval.jsonl", rows[NUM_TRAIN:])):
        (folder / name).write_text("".join(json.dumps(row) + "\n" for row in part), encoding="utf-8")


if __name__ == "__main__":
    write()
