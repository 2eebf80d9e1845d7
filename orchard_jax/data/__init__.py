"""Tokenizer and chat template, trajectory types and store, sequence packing."""
