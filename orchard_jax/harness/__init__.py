"""Agent loops that act in sandboxes and reach the model over HTTP."""
