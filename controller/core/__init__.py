"""Decision code: plain functions over plain data (pods, PodResources rows, metrics); no I/O, no clock."""
