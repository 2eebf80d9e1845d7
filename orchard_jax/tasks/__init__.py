"""Task domains: instances, task builders, graders."""
