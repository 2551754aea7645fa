"""``kubectl gpushare``: the operator's view (``view``, ``explain``: pure, raw API objects and the
agents' ``/status`` documents in) and the kubectl plugin that reads and prints it (``plugin``)."""
