"""Operator views: the cluster view (``/ui``) and shadow mode."""
