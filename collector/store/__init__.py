"""Where the collector keeps records: the Store protocol and its backends."""
