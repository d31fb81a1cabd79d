"""Worker processes: each holds leased worker IDs and mints from them."""
