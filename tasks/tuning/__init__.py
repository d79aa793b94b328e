"""Restart-on-regression: diagnosis → policy → watch → decide, with the tuning ledger.

The seeds' loop as pure functions plus one watch thread; docs/TUNING.md says how it behaves.
"""
