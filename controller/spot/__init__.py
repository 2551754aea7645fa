"""Spot: lending an idle owner's GPU (design §6): the solver (pure), the hooks the loop calls, and the host side."""
