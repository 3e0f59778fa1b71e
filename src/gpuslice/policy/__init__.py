"""Pure placement logic: fit (filter) and scoring policies in one registry.

Policies judge the node they are given (a ``model.nodes.NodeState``) and never read global state,
the clock or the cache; the extender and the simulator call exactly this code.
"""
