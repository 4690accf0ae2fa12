"""Built-in rollout filters (kind `filter`)."""
