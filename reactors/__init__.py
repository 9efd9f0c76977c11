"""Built-in reactors, one per module, using only mconn's public API."""
