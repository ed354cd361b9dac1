"""Gatehouse, the application: wiring (`app`), config, the CLI and operations on top; then the
wings web/, turn/, tools/, jobs/, inbound/, model/ and store/, each importing only those below
it (ARCHITECTURE.md)."""

__version__ = "0.1.0"
