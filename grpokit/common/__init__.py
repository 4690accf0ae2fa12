"""What several roles share: model and tokenizer loading, atomic writes, the timeline, checksums, and
QeRL's noisy norm weights (computed by the trainer, applied by the engines)."""
