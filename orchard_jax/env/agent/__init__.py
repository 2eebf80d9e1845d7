"""The in-sandbox agent for the Kubernetes backend: a small HTTP server inside each pod.

An init container copies the agent bundle (see `bundle.py`) into the pod, so any container
image works as a sandbox image; the sandbox container then runs `/orchard/bin/orchard-agent`,
which serves exec jobs, files and stats on the pod's IP, authenticated by a per-sandbox token.
The orchestrator talks to it directly (not through the Kubernetes API server).
"""
