"""Supervised fine-tuning data (`grpokit sft`): chats rendered as rollouts are, with a loss mask over the
assistant tokens, from files or from environments' reference answers, packed into TrainingBatches."""
