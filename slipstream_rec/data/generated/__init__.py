"""Generated datasets: the synthetic Criteo-like teacher (``synthetic``) and the click-log
simulator (``clicklog``), plus raw Criteo text drawn from the teacher (``criteo_text``).

Generators write one dataset into a directory they are given; caching, hashing into a directory
name and locking are the registry's (``slipstream_rec.data.datasets``), which they never import.
"""
