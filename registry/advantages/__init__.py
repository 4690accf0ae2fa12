"""Built-in advantage estimators (kind `advantage`)."""
