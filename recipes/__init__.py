"""Shipped recipes (YAML), installed as package data: `grpokit.recipes`."""
