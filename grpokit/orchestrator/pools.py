"""Easy and hard pools (prime-rl's buffer): examples whose group was easy or hard stop being sampled.

After each generation, an example whose group's mean reward r_mean satisfies
    r_mean >= easy_threshold   moves to the easy pool,
    r_mean <= hard_threshold   moves to the hard pool (easy is checked first),
and only examples in neither pool are sampled from the next epoch of the prompt order on (see
grpokit/orchestrator/prompts.py: an epoch never repeats an example, so this equals removing it at
once). The group that triggered the move is still trained on; `online_difficulty_filtering` decides that.

State: an append-only log of pool moves, one JSON line per move `{"generation", "key", "pool"}` in
`{run_dir}/buffer.jsonl`. An example's pool at the start of generation g is its last move of a
generation < g, so the log gives the pools at any generation and a resumed run restores the state of
the generation it restarts at (a partly written last line, from a killed process, is ignored). On every
resume, round(easy_fraction * |easy|) examples of the easy pool and round(hard_fraction * |hard|) of
the hard pool, drawn with a seeded RNG, move back to the normal pool (prime-rl's semantics). A run that
restarts its count (ckpt.skip_progress) keeps the pools of its checkpoint (`restart_log`).

Example keys: `{env}/{index}`, or with `hash_keys` the SHA-256 of the listed fields' values, so a
resume matches examples by content even if the dataset order changed, and equal examples are one.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from grpokit.common.io import atomic_write_text
from grpokit.environments.environment import Environment, Example
from grpokit.orchestrator.buffer import BufferSettings

POOLS = ("easy", "hard")


def example_fields(env: Environment, ex: Example) -> dict:
    """The fields hash_keys may name: `env`, `prompt` (the chat messages), `index`, and the task's data fields."""
    data = getattr(ex.task, "data", None)
    fields = (
        data.model_dump(mode="json") if hasattr(data, "model_dump") else dict(data) if isinstance(data, dict) else {}
    )
    return {**fields, "env": env.name, "prompt": ex.messages, "index": ex.index}


def hash_key(hash_keys: list[str]):
    """The key function of `data.buffer.hash_keys`: SHA-256 of the named fields' values, as JSON."""

    def key(env: Environment, ex: Example) -> str:
        fields = example_fields(env, ex)
        missing = [k for k in hash_keys if k not in fields]
        if missing:
            raise ValueError(
                f"data.buffer.hash_keys names {missing}, which example {ex.index} "
                f"of environment {env.name!r} lacks; its fields: {sorted(fields)}"
            )
        return hashlib.sha256(
            json.dumps([fields[k] for k in hash_keys], sort_keys=True, default=str).encode()
        ).hexdigest()

    return key


class DifficultyPools:
    """The easy and hard pools of a run, kept as a log of moves (see the module docstring)."""

    def __init__(self, settings: BufferSettings, path: Path, seed: int) -> None:
        self.settings, self.path, self.seed = settings, Path(path), seed
        self.events: list[dict] = []
        self.latest: dict[str, str] = {}  # each moved example's pool after every move so far

    def resume(self, start_generation: int, restore: bool = True) -> dict[str, int]:
        """Continue at start_generation with the moves of earlier generations (none if not `restore`):
        easy_fraction / hard_fraction of each pool return to normal, and the log is rewritten. Returns
        how many examples returned from each pool.
        """
        before = start_generation - 1
        self.events = [e for e in read_log(self.path) if restore and e["generation"] < start_generation]
        rng = random.Random(self.seed * 1_000_003 + start_generation)
        returned = {}
        for pool, fraction in (("easy", self.settings.easy_fraction), ("hard", self.settings.hard_fraction)):
            members = sorted(k for k, p in self.current().items() if p == pool)
            chosen = rng.sample(members, round(len(members) * fraction))
            self.events += [{"generation": before, "key": k, "pool": "normal"} for k in sorted(chosen)]
            returned[pool] = len(chosen)
        self.latest = self.current()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, "".join(json.dumps(e) + "\n" for e in self.events))
        return returned

    def current(self, generation: int | None = None) -> dict[str, str]:
        """Each moved example's pool at the start of `generation` (None: after every move so far)."""
        pools: dict[str, str] = {}
        for e in self.events:
            if generation is None or e["generation"] < generation:
                pools[e["key"]] = e["pool"]
        return pools

    def excluded(self, generation: int) -> set[str]:
        """Keys not sampled in an epoch that starts in `generation`."""
        return {k for k, p in self.current(generation).items() if p in POOLS}

    def observe(self, generation: int, key: str, mean_reward: float) -> str:
        """Classify an example by its group's mean reward; log a move into easy or hard. Returns its pool."""
        pool = self.settings.pool_of(mean_reward)
        if pool in POOLS and self.latest.get(key) not in POOLS:
            event = {"generation": generation, "key": key, "pool": pool}
            self.events.append(event)
            self.latest[key] = pool
            with open(self.path, "a") as f:
                f.write(json.dumps(event) + "\n")
        return pool

    def sizes(self) -> dict[str, float]:
        """Examples in each pool now, as metrics."""
        pools = list(self.latest.values())
        return {f"pool/{p}": float(pools.count(p)) for p in POOLS}


def restart_log(path: Path, until_generation: int | None) -> int:
    """Start a new count (ckpt.skip_progress): keep the moves of generations < until_generation (None:
    none, ckpt.skip_buffer), as made before generation 0, and rewrite the log. Returns the moves kept."""
    events = [
        {**e, "generation": -1}
        for e in read_log(path)
        if until_generation is not None and e["generation"] < until_generation
    ]
    if path.exists() or events:
        atomic_write_text(path, "".join(json.dumps(e) + "\n" for e in events))
    return len(events)


def read_log(path: Path) -> list[dict]:
    """The moves in a pool log; a missing file is empty, a truncated last line is dropped."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break  # written when the process was killed: nothing after it is complete
    return events
