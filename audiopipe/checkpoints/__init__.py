"""Model weights in and out: safe reading of upstream checkpoints, partial loading with a report, and the
converters between audiopipe's trainers and the files upstream projects read and write.

May import: `audiopipe.storage.atomic` (durable writes of converted weights).
"""
