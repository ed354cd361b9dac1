"""Helpers shared by test modules. They live here so that no test module imports another
(`tests/test_layout.py` checks it): a test module can then move or go without breaking others."""
