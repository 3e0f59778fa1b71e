"""Binding a pod: the bind flow, the binder's API writes, HAMi's node lock, requeue, liveness, leadership."""
