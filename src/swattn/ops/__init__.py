"""Kernel families: one module each, with its launcher and config choice."""
