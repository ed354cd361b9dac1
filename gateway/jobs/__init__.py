"""Scheduled work: reminders and cron jobs (APScheduler), maintenance sweeps and leader
election; jobs reach the gateway only through the small host Protocols in `host.py`."""
