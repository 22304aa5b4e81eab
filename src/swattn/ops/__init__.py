"""Kernel families: one module each, with its launcher and config choice."""

from . import _interpreter

_interpreter.install()
