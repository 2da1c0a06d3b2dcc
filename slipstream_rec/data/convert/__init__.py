"""The streaming converter (``converter``): any ``source.Source`` into the npy layout, resumable;
with its vocabularies (``vocab``) and append-only npy files (``npy_writer``).
"""
