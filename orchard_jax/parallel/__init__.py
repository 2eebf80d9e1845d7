"""Device meshes, logical axis rules and partition specs."""
