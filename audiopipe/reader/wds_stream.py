"""Old import path of the WebDataset stream, kept so that existing imports work: the code is in reader/wds/."""

from audiopipe.reader.wds import (STATE_FORMAT, StreamBatches, StreamPlan, WdsLoader, WdsStream,  # noqa: F401
                                  make_wds_loader, round_robin_taken, water_fill)
