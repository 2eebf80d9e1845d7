"""A task world's processes as one zip application started inside its rollout's sandbox.

Claw's services and GUI's browser driver both run the same way: a standard-library package is
packed into one zip application (`zipapp.build`), copied into a fresh Orchard Env sandbox and
started with one exec (`host.SandboxApp`); inside, `supervisor.start` binds the ports, forks a
supervisor that leaves the command's session and starts one process per part, and the command
returns once every part that has to report is ready. Every process lives in the sandbox, so
deleting the sandbox ends them all.

This package's `__init__` imports nothing: `supervisor` is copied into the zip applications
and must import under any interpreter that runs them.
"""
