"""Flax NNX policy and value models (Qwen3-MoE, Qwen3.5-MoE, dense Qwen3), presets and Hugging Face I/O."""
