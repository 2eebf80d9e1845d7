"""JAX sampler, SGLang-compatible inference server, SGLang client, recording proxy."""
