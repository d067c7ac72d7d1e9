"""Training data: the synthetic task generator, distillation prompts and self-distilled chats."""
