"""One module per CLI command; each exposes ``run(cfg) -> int`` (an exit status)."""
