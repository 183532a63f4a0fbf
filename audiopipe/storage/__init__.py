"""Where bytes land: durable local writes, object storage, and the guarded reads of input files (guard.py).
Nothing here knows about features or Ray.

May import: nothing else of audiopipe.
"""
