"""Analyses that compute numbers (no plotting): executable theory, and later real-model studies."""
