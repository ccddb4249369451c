"""Cause and effect across sibling rooms (fabric under training; storage under training next)."""
