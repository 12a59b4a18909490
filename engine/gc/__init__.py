"""Garbage collection support: address layout, link tokens, copy tracking, GC preparation."""
