"""Compatibility packages: other engines' module paths and names over pagedkv."""
