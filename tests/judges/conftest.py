"""What the judge tests share: a random tiny classifier reward model."""

import pytest


@pytest.fixture(scope="session")
def tiny_classifier(tiny_model, tmp_path_factory) -> str:
    """A random one-label classifier the shape grpokit.envs.exclaim.train_judge trains, untrained."""
    from transformers import AutoTokenizer

    from grpokit.envs.exclaim.train_judge import build_model

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    path = tmp_path_factory.mktemp("exclaim-rm")
    build_model(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
