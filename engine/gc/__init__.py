"""Garbage collection support: physical-address layout, link tokens, copy tracking, GC preparation."""
