"""The agent's tools: the registry every tool is called through, and the memory, history
lookup and scheduling tools."""
