"""Imports every module that registers a built-in policy, so the registry sees them all."""
