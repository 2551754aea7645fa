"""Sharing one GPU among N pods through shadow pods (design §3).

The leader's pass (``cluster_pass``) plans shadows for the whole cluster from its view of the
pods (``cluster_view``) with the share solver (``solver``); sharers on their way to a slot are
tracked (``placing``), idle shadows leave service without losing a sharer (``shadow_drain``),
a sharer whose shadow is gone loses its GPU (``holdings``), and a spec this configuration does
not serve is refused (``served``). ``node_watch`` keeps the nodes' published capacity.
Everything but ``cluster_pass`` and ``node_watch`` is decision code: no I/O, no clock.
"""
