"""Lightning callbacks that tie the trainer to the rest of the loop."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L

from grpokit.broadcast import WeightBroadcast
from grpokit.common.checksums import tensors_sha256
from grpokit.common.graph_capture import capture_lock

log = logging.getLogger(__name__)


class WeightSync(L.Callback):
    """Publishes the policy's weights when training starts (or resumes) and after every optimizer step.

    Step numbering: the weights published as step n have seen n optimizer steps, and the trainer's
    step n trains on the batch for step n. Publishing at on_train_start works because Policy takes
    the dataloader iterator, so Lightning fetches no batch before it (the first batch needs them).
    With several trainer ranks only global rank 0 publishes; under FSDP2 every rank first joins the
    gather of the full weights (Policy.weight_update).

    A run that ends at max_steps always leaves the final step's weights published: a process killed
    after writing its last checkpoint but before publishing resumes at max_steps, where Lightning runs
    no training hooks at all, so teardown publishes them.
    """

    def __init__(self, broadcast: WeightBroadcast) -> None:
        self.broadcast = broadcast
        self.published_step = -1

    def _publish(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Publish the current weights from rank 0 (DDP ranks hold identical weights; rank 0 speaks for
        them). Sharded weights are gathered first, which every rank joins. Their copies are made under
        `capture_lock`, as a training step is: an allocator retry (cudaFree, a device-wide sync) must not
        overlap a co-located engine's graph capture. Not the publish: a broadcast may wait for a receiver."""
        if trainer.is_global_zero or getattr(pl_module, "sharded", False):
            with capture_lock(pl_module.device):
                update = pl_module.weight_update(trainer.global_step)
            if trainer.is_global_zero:
                self.broadcast.publish(update)
        self.published_step = trainer.global_step

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._publish(trainer, pl_module)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        try:
            ended = stage == "fit" and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps
            if ended and self.published_step < trainer.global_step:
                self._publish(trainer, pl_module)
        finally:
            self.broadcast.close()  # frees sockets, process groups or shared-memory segments

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if self.published_step == trainer.global_step:  # no step trained (a signal ended the wait for a batch)
            return
        start = time.perf_counter()
        self._publish(trainer, pl_module)
        pl_module.last_weight_sync_time = time.perf_counter() - start  # logged with the next step's row


class StopOnInterrupt(L.Callback):
    """Ctrl-C (SIGINT) or SIGTERM ends training after the current step instead of at once.

    Lightning's own answer to Ctrl-C is a KeyboardInterrupt in the middle of whatever runs, then
    `sys.exit(1)` with `grpokit fit`'s rollout thread still inside the engine: the interpreter shuts down
    under it and the process aborts ("terminate called without an active exception"), with the steps
    since the last checkpoint lost. Its answer to SIGTERM (2.x) is a SIGTERMException (a SystemExit with
    no code) after the step: no checkpoint, and exit code 0, which a scheduler or a sweep takes for a
    finished run. Here the first signal only asks to stop; at the end of the step in progress (or
    awaited: `grpokit fit` takes the batch its rollout thread is making; `grpokit train`, whose batches
    come from another process that may be gone, stops waiting within a second, see
    Orchestrator.stop_requested) `trainer.should_stop` is set, which the Checkpointer answers with a
    checkpoint of the step reached, and fit ends through its normal teardown (the rollout thread stopped
    and joined, the broadcast closed). grpokit.main then exits with `exit_code`: 128 + the signal, the
    shell's code for a command ended by it (130 for SIGINT, 143 for SIGTERM). A second signal exits at
    once (os._exit(128 + it)): every file grpokit writes is renamed into place whole, so that is as
    harmless as a kill (docs/reliability.md).

    Install it (main thread) before the rollout thread starts, so no Ctrl-C reaches Lightning's handler;
    Lightning installs its SIGTERM handler just before training starts, and on_train_start takes SIGTERM
    back. With several trainer ranks (each gets the terminal's SIGINT, a scheduler's SIGTERM may reach one)
    they agree on the step to stop at.
    """

    SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}

    def __init__(self) -> None:
        self.requested = False  # a signal reached this process
        self.signum: int | None = None  # which one
        self.stopping = False  # training stops at this step: this rank's signal or another's
        self.stopped_at: int | None = None  # the steps done when a signal ended training before max_steps
        self._previous: dict[int, object] = {}  # the handlers to restore, while installed

    @property
    def signal_name(self) -> str:
        """How the run summary names what stopped it: "Ctrl-C" or "SIGTERM"."""
        return self.SIGNALS.get(self.signum, "Ctrl-C")

    @property
    def exit_code(self) -> int:
        """128 + the signal when it ended training before max_steps, else 0 (grpokit.main returns it); a
        rank stopped by another rank's signal counts it as SIGTERM (a scheduler's)."""
        if self.stopped_at is None:
            return 0
        return 128 + (self.signum or signal.SIGTERM)

    def install(self) -> None:
        """Take over SIGINT and SIGTERM (only the main thread may; elsewhere they keep their handlers)."""
        if threading.current_thread() is threading.main_thread() and not self._previous:
            self._previous = {signum: signal.signal(signum, self._on_signal) for signum in self.SIGNALS}

    def _on_signal(self, signum, frame) -> None:
        # os.write, not print: a signal handler may run while the main thread is inside a print to stderr
        if not self._previous:  # Lightning restored this handler after uninstall (its teardown on an error)
            signal.signal(signum, signal.SIG_DFL if signum == signal.SIGTERM else signal.default_int_handler)
            signal.raise_signal(signum)
            return
        name = self.SIGNALS[signum]
        if self.requested:
            os.write(2, f"\ngrpokit: second {name}: exiting now (resume with --ckpt.resume_step -1)\n".encode())
            os._exit(128 + signum)
        self.requested, self.signum = True, signum
        again = "Ctrl-C again" if signum == signal.SIGINT else "a second SIGTERM or Ctrl-C"
        os.write(2, f"\ngrpokit: {name}: stopping after the current step ({again} to exit at once)\n".encode())

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """`grpokit train` on one rank: the wait for a batch ends once a signal asks to stop. With several
        ranks the others wait for rank 0's batch, so rank 0 waits too (bounded by data.timeout)."""
        data = trainer.datamodule
        if hasattr(data, "stop_requested") and trainer.world_size == 1:
            data.stop_requested = lambda: self.requested

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Take SIGTERM back from Lightning's handler (installed just before training starts); a SIGTERM
        between the two already reached this one too, so Lightning's flag is dropped."""
        if self._previous and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            connector = getattr(trainer, "_signal_connector", None)
            if connector is not None:
                connector.received_sigterm = False

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if trainer.strategy.reduce_boolean_decision(self.requested, all=False):  # on this rank or another
            self.stopping = trainer.should_stop = True  # before the Checkpointer's hook of this step, which saves it

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.stopping and trainer.global_step < trainer.max_steps:
            self.stopped_at = trainer.global_step  # the run's summary says so (grpokit.cli.summary)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.uninstall()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.uninstall()

    def uninstall(self) -> None:
        """Give SIGINT and SIGTERM back to the handlers they had before install()."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            default = signal.SIG_DFL if signum == signal.SIGTERM else signal.default_int_handler
            signal.signal(signum, handler if handler is not None else default)


class ShareBaseWeights(L.Callback):
    """Co-locate `fit` with LoRA: the engine samples with the trainer's frozen base weights instead of a
    copy of its own (BuiltinEngine.share_base_weights), once the trainer's model is on its device and
    before the first weights are published (so before WeightSync's on_train_start). The rollout thread
    is held until then (ReleaseRolloutThread): the swap frees the engine's own copies."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        shared = self.engine.share_base_weights(pl_module.lm)
        log.info("engine shares %.1f MiB of base weights with the trainer", shared / 2**20)


class ReleaseRolloutThread(L.Callback):
    """Co-locate `fit`: the rollout thread starts before `trainer.fit` (Orchestrator.start) but touches
    the engine only once training starts (`ready`, set here at on_train_start, after ShareBaseWeights).
    Until then Lightning sets up on the main thread (the model to the device, a checkpoint's restore),
    and a resumed run's engine, which has weights to sample with at once, would capture CUDA graphs
    meanwhile (nothing guards those calls against a capture) and size its KV cache before the trainer's
    memory is taken, or sample with base weights ShareBaseWeights is about to free."""

    def __init__(self) -> None:
        self.ready = threading.Event()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.ready.set()


class StopRolloutThread(L.Callback):
    """Co-locate `fit`: stop the rollout thread (Orchestrator.stop) at on_train_end, before Lightning's
    teardown moves the model off the GPU and empties the CUDA cache, which must not happen while the
    engine captures a CUDA graph or decodes. Training ends early with the thread still generating later
    steps after a Ctrl-C (StopOnInterrupt); the other ways out stop it through the Orchestrator's
    on_exception and teardown."""

    def __init__(self, stop: Callable[[], None]) -> None:
        self.stop = stop

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.stop()


class RankChecksums(L.Callback):
    """Writes the sha256 of each rank's publishable weights after every step, one file per rank:
    `{run_dir}/rank_checksums/rank_{R}.jsonl` with {"step", "rank", "sha256"} lines.

    A check that DDP ranks stay identical (they must: every rank applies the same all-reduced gradient),
    and that what rank 0 publishes is what every rank trains. Under FSDP2 each rank holds a shard, so
    only rank 0 writes (the gathered weights it publishes). Add it with
    `--trainer.callbacks+=grpokit.trainer.callbacks.RankChecksums`; it costs one copy of the trainable weights
    per step.
    """

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        step = trainer.global_step
        tensors = pl_module.weight_update(step).tensors
        if getattr(pl_module, "sharded", False) and not trainer.is_global_zero:
            return
        line = json.dumps({"step": step, "rank": trainer.global_rank, "sha256": tensors_sha256(tensors)})
        folder = Path(trainer.default_root_dir) / "rank_checksums"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"rank_{trainer.global_rank}.jsonl", "a") as f:
            f.write(line + "\n")
