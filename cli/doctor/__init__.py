"""``gpushare doctor``: facts about the node (``host_probe``, ``socket_probe``), their verdicts
(``verdicts``, pure) and the command that prints them (``command``)."""
