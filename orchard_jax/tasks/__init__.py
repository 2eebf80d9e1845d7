"""Task domains: instances, task builders, graders."""
from orchard_jax.tasks.errors import TaskError
