"""The HTTP side: the aiohttp server (webchat, health, metrics, webhook routes), the admin UI
and the guard every request passes (Host/Origin checks, bounded bodies)."""
