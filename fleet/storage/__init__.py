"""The storage room: file system and disk series from node_exporter."""
