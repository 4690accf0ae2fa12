"""Argument parsing for `grpokit pretrain-vision --model M --env ID [--env_args JSON] --out DIR ...`, and
the (picture, labels) pairs read from the environment."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from grpokit.pretrain.loop import PretrainSettings, pretrain_vision

SETTINGS_HELP = {
    "steps": "optimizer steps",
    "batch_size": "pictures a step",
    "lr": "AdamW learning rate of the tower and the heads",
    "warmup_steps": "steps of linear warm-up to --lr",
    "weight_decay": "AdamW weight decay",
    "eval_pictures": "the last pictures, held out and scored",
    "eval_interval": "steps between held-out scores",
    "seed": "the heads' initialisation and the picture order",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    import grpokit.pretrain

    p = argparse.ArgumentParser(
        prog="grpokit pretrain-vision",
        description=grpokit.pretrain.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="the vision-language model (alias, folder or HF id)")
    p.add_argument("--env", required=True, help="the environment whose prompts hold the pictures (e.g. shapes)")
    p.add_argument("--env_args", type=json.loads, default={}, help="its args as JSON, e.g. '{\"num_tasks\": 20000}'")
    p.add_argument("--labels_field", default="labels", help="the task data field of each picture's labels")
    p.add_argument("--out", required=True, metavar="DIR", help="the model folder to write (new, unless --force)")
    p.add_argument("--force", action="store_true", help="replace an existing --out folder")
    p.add_argument("--num_threads", type=int, default=None, help="torch CPU threads")
    for key, value in vars(PretrainSettings()).items():
        p.add_argument(f"--{key}", type=type(value), default=value, help=f"{SETTINGS_HELP[key]} (default {value})")
    return p.parse_args(argv)


def labelled_pictures(env_id: str, env_args: dict, labels_field: str) -> tuple[list, list[dict]]:
    """Each example's first prompt image and the `labels_field` of its task data (key -> value)."""
    from grpokit.environments.environment import Environment, EnvSpec
    from grpokit.vision.messages import prompt_images

    env = Environment(EnvSpec(id=env_id, args=env_args))
    pictures, labels = [], []
    for example in env.examples:
        label = f"environment {env_id!r} example {example.index}"
        found = getattr(example.task.data, labels_field, None)
        if not isinstance(found, dict) or not found:
            raise ValueError(
                f"{label}: its task data has no field {labels_field!r} of labels (a dict such as "
                '{"colour": "red"}); set --labels_field to the field that holds what the picture shows'
            )
        _, images = prompt_images(example.messages, label=label)
        if not images:
            raise ValueError(f"{label}: its prompt holds no image; pretrain-vision needs an image per example")
        pictures.append(images[0])
        labels.append(found)
    return pictures, labels


def pretrain_main(argv: list[str]) -> int:
    """`grpokit pretrain-vision`: the environment's pictures and labels, then pretrain_vision."""
    args = parse_args(argv)
    settings = PretrainSettings(**{key: getattr(args, key) for key in vars(PretrainSettings())})
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.force:
        raise SystemExit(f"--out {out}: the folder exists and is not empty; pass --force to replace it")
    if args.num_threads:
        import torch

        torch.set_num_threads(args.num_threads)
    pictures, labels = labelled_pictures(args.env, args.env_args, args.labels_field)
    final = pretrain_vision(args.model, pictures, labels, out, settings)
    print(json.dumps({"out": str(out), **final}))
    return 0
