"""Branchwater engine: versioned metadata for a data lake on a KV store and an object store."""
