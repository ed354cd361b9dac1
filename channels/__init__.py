"""Channel adapters: each platform event becomes an InboundMessage; replies leave as OutboundMessage."""
