"""The only package that touches vLLM internals beyond the model class."""
