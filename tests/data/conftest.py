"""Fixtures of the data room's tests."""
import pytest

from orchard_jax.data import tiny_tokenizer


@pytest.fixture(scope="session")
def tok():
  """The tiny BPE (trained once per machine, then loaded from ~/.cache/orchard_jax)."""
  return tiny_tokenizer()
