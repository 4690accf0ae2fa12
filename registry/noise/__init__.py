"""Built-in noise schedulers (kind `noise`): sigma of the QeRL noise on the engine's norm weights."""
