"""The workspace memory directory: AGENTS.md, MEMORY.md, daily notes, artifacts."""
