"""Orchard Env: the sandbox service, its SDK and its backends."""
