"""The extender's HTTP side: the routes kube-scheduler and operators call, and the server running them."""
