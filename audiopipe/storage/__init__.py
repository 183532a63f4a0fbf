"""Where bytes land: durable local writes (and, later, object storage). Nothing here knows about features or Ray."""
