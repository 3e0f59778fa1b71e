"""Frozen value types shared by every layer: devices, nodes, topology, requests, allocations, status."""
