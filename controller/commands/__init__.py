"""Sub-commands of the one `gpushare` CLI, one module per part; `controller.cli` mounts them."""
