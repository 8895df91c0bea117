"""Fault injection on a real cluster, a recorded history, and a checker for it."""
