"""Replay: turning the log back into a replica. Both ends run it; neither owns it.

follower.py (read RUN.updates, reassemble, verify, hand back what to apply), checks.py (the follower's checks
of one message that need no chain: `hilo inspect --offset` runs them too), snapshot.py (a process's own
saved state and position), history.py (what each process applied, and the checker), start.py (where a
process starts: its snapshot, a checkpoint, or nothing yet).
"""
