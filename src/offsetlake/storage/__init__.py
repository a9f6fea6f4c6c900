"""Where tables live (a Location: URI, options, retries) and the Parquet files written into them."""
