"""Cluster backends (local, AWS) behind one interface, and the job description they share."""
