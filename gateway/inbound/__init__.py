"""Inbound: from a normalized platform message to a stored message in its session's lane —
text hygiene, access (pairing, allowlists, mention gating), session keys, session lanes."""
