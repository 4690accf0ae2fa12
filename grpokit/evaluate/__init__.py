"""`grpokit eval`: a run's weights and/or the base model on the recipe's eval problems, k samples each,
with pass@k, maj@k, mean reward and the environments' metrics, bootstrap intervals and a paired
comparison (docs/evaluation.md). A tool on the recipe CLI, like sweep/ and bench/."""
