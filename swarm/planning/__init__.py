"""Planning (event loop): the plan from the discovery view, loading our part, agreement across the swarm."""
