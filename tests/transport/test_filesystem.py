"""Filesystem transport: round trip, and a reader racing a writer never sees a partial batch."""

import threading

import pytest
import torch

from grpokit.transport.codec import BatchFormatError, decode_batch, encode_batch
from grpokit.transport.filesystem import FilesystemTransport
from grpokit.types import MicroBatch, TrainingBatch


def make_batch(step: int, tokens: int = 64) -> TrainingBatch:
    g = torch.Generator().manual_seed(step)
    return TrainingBatch(step=step, micro_batches=[micro_batch(g, tokens), micro_batch(g, tokens // 2)], temperature=0.7, metrics={"reward": 0.25 * step})


def micro_batch(g: torch.Generator, tokens: int) -> MicroBatch:
    return MicroBatch(
        input_ids_T=torch.randint(0, 1000, (tokens,), generator=g),
        position_ids_T=torch.arange(tokens),
        loss_mask_T=torch.ones(tokens),
        advantages_T=torch.randn(tokens, generator=g),
        inference_logprobs_T=-torch.rand(tokens, generator=g),
        seq_lens_N=torch.tensor([tokens]),
        is_truncated_N=torch.tensor([False]),
    )


def assert_same(a: TrainingBatch, b: TrainingBatch) -> None:
    assert (a.step, a.temperature, a.metrics, len(a.micro_batches)) == (b.step, b.temperature, b.metrics, len(b.micro_batches))
    for x, y in zip(a.micro_batches, b.micro_batches):
        for name in vars(x):
            assert torch.equal(getattr(x, name), getattr(y, name)), name


def test_codec_round_trip_and_rejects_garbage():
    batch = make_batch(3)
    assert_same(decode_batch(encode_batch(batch)), batch)
    data = encode_batch(batch)
    with pytest.raises(BatchFormatError, match="truncated"):
        decode_batch(data[:5])
    with pytest.raises(BatchFormatError):
        decode_batch(data[: len(data) // 2])
    with pytest.raises(BatchFormatError, match="exceeds"):
        decode_batch(data, max_bytes=10)


def test_receive_times_out_with_a_clear_message(tmp_path):
    t = FilesystemTransport()
    t.setup(tmp_path)
    with pytest.raises(TimeoutError, match="no batch for step 0"):
        t.receive(0, timeout=0.1)


def test_reader_racing_writer_sees_only_whole_batches(tmp_path):
    writer, reader = FilesystemTransport(), FilesystemTransport(poll_interval=0.001, keep_last=0)
    writer.setup(tmp_path)
    reader.setup(tmp_path)
    steps = 30
    batches = [make_batch(s, tokens=20_000) for s in range(steps)]  # ~0.5 MB each: writes take a while

    def write_all():
        for b in batches:
            writer.send(b)

    thread = threading.Thread(target=write_all)
    thread.start()
    for s in range(steps):
        assert_same(reader.receive(s, timeout=30), batches[s])  # decode fails loudly on any partial file
    thread.join()
    assert not list((tmp_path / "rollouts").glob("*.tmp"))
