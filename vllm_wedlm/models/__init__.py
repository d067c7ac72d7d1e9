"""WeDLM model classes: the transformers config, the vLLM model, the transformers reference body."""
