"""Textual widgets of the swarm dashboard."""
