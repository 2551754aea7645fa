"""The agent's shared vocabulary: pods and their roles, actions, records, the mapping, the idle detector.

Plain functions over plain data; no I/O, no clock.
"""
