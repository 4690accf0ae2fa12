"""Streamed text (grpokit.inference.server.stream.TextDeltas), the stop-string limits and the answers'
logprob shapes, without a model: the deltas join to exactly the plain answer's text, never show a stop
string or an incomplete UTF-8 character, and hold back an end that may become a stop string."""

from __future__ import annotations

import pytest

from grpokit.inference.server.answers import Answers, cut_at_stop
from grpokit.inference.server.limits import ServerLimits
from grpokit.inference.server.requests import RequestError, parse_stop
from grpokit.inference.server.stream import TextDeltas

pytestmark = pytest.mark.unit


def byte_decoder(pieces: list[bytes]):
    """A byte-level tokenizer's decode: token i is pieces[i]; incomplete UTF-8 decodes to U+FFFD."""
    return lambda ids: b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")


def stream(pieces: list[bytes], stop: list[str], steps: list[list[int]]) -> tuple[list[str], str]:
    """The deltas of each step and the rest after the last, for tokens arriving in `steps`."""
    decode = byte_decoder(pieces)
    deltas = TextDeltas(decode, stop)
    sent = [deltas.add(ids) for ids in steps]
    final = cut_at_stop(decode([i for ids in steps for i in ids]), stop)
    return sent, deltas.rest(final)


WORDS = [b"Hello", b" wor", b"ld", b"!", b" END", b" more", b"\xc3", b"\xa9", b"E", b"N", b"D"]


@pytest.mark.parametrize(
    ("stop", "steps", "want"),
    [
        ([], [[0], [1], [2], [3]], (["Hello", " wor", "ld", "!"], "")),
        ([" END"], [[0], [1], [4], [5]], (["Hello", " wor", "", ""], "")),  # nothing of the stop string shows
        (["ld!"], [[0], [1], [2], [3]], (["Hello", " wor", "", ""], "")),  # "ld" held back until it is a stop
        (["ld?"], [[0], [1], [2], [3]], (["Hello", " wor", "", "ld!"], "")),  # ... and sent once it cannot be
        (["END"], [[0], [6], [7], [8], [9]], (["Hello", "", "é", "", ""], "EN")),  # no half "é"; "EN" held back
        (["END"], [[0], [8], [9], [10]], (["Hello", "", "", ""], "")),
        (["EN"], [[0], [8], [1]], (["Hello", "", "E wor"], "")),
        ([" more"], [[0, 1, 2, 3]], (["Hello world!"], "")),  # several tokens in one step (a whole completion)
    ],
)
def test_text_deltas_join_to_the_plain_answer(stop, steps, want):
    sent, rest = stream(WORDS, stop, steps)
    assert (sent, rest) == want
    final = cut_at_stop(byte_decoder(WORDS)([i for ids in steps for i in ids]), stop)
    assert "".join(sent) + rest == final


def test_a_stop_string_completed_later_but_begun_earlier_cuts_where_it_begins():
    """With stops "abc" and "b", text "ab" is cut at "b" (index 1) for now, but "abc" may complete and
    cut at 0, as the plain answer would (min_tokens lets decoding go on past a stop): nothing is sent."""
    pieces = [b"a", b"b", b"c"]
    sent, rest = stream(pieces, ["abc", "b"], [[0], [1], [2]])
    assert sent == ["", "", ""] and rest == ""
    sent, rest = stream(pieces, ["abc", "b"], [[0], [1]])
    assert "".join(sent) + rest == "a"


def test_a_tokenizer_that_merges_across_tokens_decodes_through_the_window():
    # SentencePiece-like: a leading space is dropped at the start of a decode, so each piece alone differs
    def decode(ids):
        return "".join(["▁Hi", "▁there", "!"][i] for i in ids).replace("▁", " ").lstrip(" ")

    deltas = TextDeltas(decode, [])
    sent = [deltas.add([i]) for i in range(3)]
    assert "".join(sent) + deltas.rest(decode([0, 1, 2])) == "Hi there!"


def test_stop_limits_name_their_keys():
    limits = ServerLimits()
    assert parse_stop({"stop": "x"}, limits) == ["x"] and parse_stop({}, limits) == []
    assert parse_stop({"stop": ["a"] * 16}, limits) == ["a"] * 16
    with pytest.raises(RequestError, match=r"17 stop strings, over the limit of 16 \(server.limits.max_stop\)"):
        parse_stop({"stop": ["a"] * 17}, limits)
    with pytest.raises(RequestError, match=r"257 characters, over the limit of 256 \(server.limits.max_stop_chars\)"):
        parse_stop({"stop": ["a" * 257]}, limits)
    with pytest.raises(RequestError, match="non-empty string"):
        parse_stop({"stop": [""]}, limits)
    assert ServerLimits(max_top_logprobs=0).max_top_logprobs == 0
    with pytest.raises(ValueError, match="server.limits.max_stop must be a number > 0"):
        ServerLimits(max_stop=0)
    with pytest.raises(ValueError, match="server.limits.max_top_logprobs must be a number >= 0"):
        ServerLimits(max_top_logprobs=-1)


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def test_logprob_shapes_with_top_alternatives():
    answers = Answers(CharTokenizer(), "m")
    tops = [[(ord("a"), -0.1), (ord("b"), -2.5)], [(ord("c"), -0.2), (ord("é"), -1.9)]]
    chat = answers.chat_logprobs([ord("a"), ord("é")], [-0.1, -1.9], tops)
    assert chat[1] == {
        "token": "é",
        "logprob": -1.9,
        "bytes": [0xC3, 0xA9],
        "top_logprobs": [
            {"token": "c", "logprob": -0.2, "bytes": [0x63]},
            {"token": "é", "logprob": -1.9, "bytes": [0xC3, 0xA9]},
        ],
    }
    plain = answers.completion_logprobs([ord("x"), ord("a")], [-float("inf"), -0.1], tops, offset=3)
    assert plain == {
        "tokens": ["x", "a"],
        "token_logprobs": [-9999.0, -0.1],
        "top_logprobs": [{"a": -0.1, "b": -2.5, "x": -9999.0}, {"c": -0.2, "é": -1.9, "a": -0.1}],
        "text_offset": [3, 4],
    }
    assert answers.completion_logprobs([ord("x")], [-0.5], None)["top_logprobs"] == [{"x": -0.5}]
