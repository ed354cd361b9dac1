"""The same attacks against every HTTP endpoint the gateway serves (`attacks.py` lists them; the
suite and `bench/hardening.py` both run that list)."""
