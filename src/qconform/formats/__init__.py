"""Byte layouts and scalar conversions; imports nothing else of qconform."""
