"""Built-in losses (kind `loss`)."""
