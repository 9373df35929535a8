"""Helpers shared by every kind of test: local AWS endpoints, tables from the template, data."""
