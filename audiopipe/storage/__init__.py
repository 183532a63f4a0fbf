"""Where bytes land: durable local writes, object storage, and the guarded reads of input files (guard.py).
Nothing here knows about features or Ray.

May import: `audiopipe.after_fork` (what a forked child resets: the S3 clients and range fetchers, a held lock's
descriptor).
"""
