"""Adapters that run oospec's drafting inside other serving engines."""
