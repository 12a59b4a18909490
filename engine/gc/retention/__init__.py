"""Committed-data retention: the rules a repository keeps (`rules`) and which commits, and
so which addresses, they let GC delete (`expiry`)."""
