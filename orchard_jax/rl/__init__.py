"""The training algorithms as pure functions on arrays (ALGORITHMS.md sections 1-6)."""
