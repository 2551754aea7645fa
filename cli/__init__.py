"""The command line of every part: ``gpushare`` (``cli.main``) and ``kubectl gpushare`` (``cli.kubectl``).

The top of the import graph: it wires the agent and the parts and presents what they know;
nothing imports it. ``cli.doctor`` judges whether a node can serve gpushare, ``cli.kubectl``
is the operator's view from any machine with a kubeconfig. Their verdicts and views are
plain functions over plain data, like the agent's decision code.
"""
