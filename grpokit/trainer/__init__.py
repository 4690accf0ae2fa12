"""The trainer role: the Policy LightningModule and what it needs (model set-up, packed logprobs,
prefix trees, optimizers and schedules, sharding, guards, checkpoints, loggers, callbacks)."""
