"""Scoring: the only code that reads ground truth. Pure functions over a saved EventLog."""
