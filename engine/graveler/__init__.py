"""The versioned model: refs, staging, committed ranges, and the operations on them."""
