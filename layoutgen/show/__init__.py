"""Byte maps of a layout (being split into model, text, PNG and diff)."""
