"""Scoring generated answers: HumanEval pass@1 in a sandboxed process."""
