"""Learnt retrieval: item-to-item tables built offline from the event log
(co-occurrence kNN, EASE) or brought by the team, their files, and the rules
that fuse them. Pure NumPy; the ranker serves them (services/ranker/learnt.py)."""
