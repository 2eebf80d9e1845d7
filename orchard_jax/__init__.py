"""orchard_jax: train software-engineering, browser and assistant agents the Orchard way, in JAX."""
